"""The pure decision core: the data model, the action vocabulary, history and its derived
fields, facts, decide (one gate), guards, sanity checks on a listing; and the field types
every settings model shares (`fields`: secrets, http(s) URLs).

Must not: touch the network, a database, files, the clock, randomness or logging; import the
rule engine or any other room of the controller (`rules`, `store`, `fleet`, `service`, `sim`,
`tools`) or `escalation`. `now` is an argument; everything comes in as data.
"""
