"""The LLM reader's errors (see escalation.llm for when each is raised).

LLMError                  the prompt could not be rendered (a template problem)
 ├── LLMUnavailable       no answer: refused connection, timeout, HTTP 408/409/429/5xx after the
 │                        retries, another HTTP error, a body that is not a chat completion
 ├── LLMBudgetExceeded    the call or token budget is used up; nothing was sent
 └── LLMInvalidAnswer     the model answered, but not with one valid, allowed action
"""

from __future__ import annotations


class LLMError(Exception):
    """The LLM gave no usable answer; the situation goes to people."""


class LLMUnavailable(LLMError):
    """No answer came back (network, timeout, HTTP error, not a chat completion)."""


class LLMBudgetExceeded(LLMError):
    """The calls-per-hour or tokens-per-day budget is used up; no request was sent."""


class LLMInvalidAnswer(LLMError):
    """The model answered, but not with exactly one valid, allowed action."""

    raw: str = ""  # what the model said (tool calls or content), capped; set by LLMClient
