"""Where the journal lives (SQLite or PostgreSQL): actions and intents, escalations, tracks and
hosts, LLM usage, the leader lease, instance records.

Must not: make HTTP calls, evaluate rules or decide; import `rules`, `fleet`, `service`,
`sim`, `tools` or `escalation`.
"""
