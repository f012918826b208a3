"""A fake OpenAI-compatible LLM server: real HTTP on 127.0.0.1, scripted replies, recorded requests.

    with FakeOpenAI(ToolCall("hold", {...}), Status(503), default="escalate") as fake:
        settings = LLMSettings(base_url=fake.url, model=fake.model)
        ...
        fake.chat_bodies[0]["tools"]

It speaks enough of `POST /v1/chat/completions` and `GET /v1/models`. Each chat request takes
the next scripted reply; when the script is empty the `default` behaviour answers:

    "escalate"     an escalate_to_human tool call (a JSON decision in json_schema mode)
    "never_tools"  plain text, never a tool call (a model or server without tool support)
    "smart"        a valid answer picked from the request's own tools: `replace` the subject of a
                   situation whose DATA block shows it frozen, else escalate_to_human; it reads
                   the prompt as escalation/templates/prompt_user.txt.j2 writes it

A request holding a key named in `unsupported` is answered 400 with OpenAI's error, as OpenAI
answers `max_tokens` sent to a reasoning model.

Every request is recorded (method, path, headers, JSON body); answers carry `usage` counts
(a fixed `total_tokens` when given, else about a token per 4 characters). A `Delay` waits
before answering (cut short when the server stops), so a client with a short timeout gives up.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from fakes.base import QuietHandler, RecordingServer

Default = Literal["escalate", "never_tools", "smart"]


@dataclass(frozen=True)
class ToolCall:
    """One tool call; `arguments` as a dict (sent as JSON) or as the raw string to send."""

    name: str
    arguments: dict[str, Any] | str


@dataclass(frozen=True)
class ToolCalls:
    """Several tool calls in one answer."""

    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class Content:
    """Plain assistant content, no tool call."""

    text: str


@dataclass(frozen=True)
class Refusal:
    """A refusal: `content` null and the model's words in `refusal`, as OpenAI sends one."""

    text: str


@dataclass(frozen=True)
class Ended:
    """`then`'s message, stopped with this `finish_reason` (`length`: max_tokens ran out;
    `content_filter`: the server's filter withheld content), with what a reasoning model thought
    in `reasoning_content` when given (vLLM, llama.cpp, DeepSeek)."""

    finish_reason: str
    then: ToolCall | ToolCalls | Content | Refusal
    reasoning: str | None = None


@dataclass(frozen=True)
class RawBody:
    """Exactly these bytes as the HTTP body (malformed JSON, an HTML error page, ...)."""

    body: str
    status: int = 200
    content_type: str = "application/json"


@dataclass(frozen=True)
class Status:
    """An HTTP error status with a body, and a Retry-After header when given."""

    code: int
    body: str = '{"error": {"message": "scripted failure"}}'
    retry_after: str | None = None


@dataclass(frozen=True)
class Delay:
    """Wait `seconds`, then answer with `then` (or the default behaviour)."""

    seconds: float
    then: Reply | None = None


Reply = ToolCall | ToolCalls | Content | Refusal | Ended | RawBody | Status | Delay


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # the decoded JSON body, or None


def decision(action: str, params: dict[str, Any], confidence: float, rationale: str) -> Content:
    """A json_schema-mode answer: the decision object as content."""
    doc = {"action": action, "params": params, "confidence": confidence, "rationale": rationale}
    return Content(json.dumps(doc))


def closed_port_url() -> str:
    """A /v1 base URL on a port nothing listens on (bound, then released): connections fail."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


class FakeOpenAI:
    """The server; a context manager that starts it in a thread and stops it on exit."""

    def __init__(
        self,
        *replies: Reply,
        default: Default = "escalate",
        model: str = "fake-model",
        total_tokens: int | None = None,
        report_usage: bool = True,
        unsupported: tuple[str, ...] = (),
    ) -> None:
        self.default = default
        self.unsupported = unsupported  # request keys answered with OpenAI's 400
        self.model = model
        self.total_tokens = total_tokens
        self.report_usage = report_usage
        self.requests: list[Recorded] = []
        self.errors: list[BaseException] = []  # handler errors (a client that hung up early)
        self._replies: deque[Reply] = deque(replies)
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def chat_bodies(self) -> list[Any]:
        return [r.body for r in self.requests if r.path.endswith("/chat/completions")]

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()  # joins the handler threads
        self._thread.join()

    # ---- used by the handler -------------------------------------------------------------

    def record(self, entry: Recorded) -> Reply | None:
        with self._lock:
            self.requests.append(entry)
            return self._replies.popleft() if self._replies else None

    def default_reply(self, body: Any) -> Reply:
        if self.default == "never_tools":
            return Content("I think you should probably replace it, but I cannot call tools.")
        if self.default == "smart":
            return _smart(body)
        return _escalate(body)

    def usage(self, body: Any, message: dict[str, Any]) -> dict[str, int]:
        prompt = len(json.dumps(body)) // 4
        completion = len(json.dumps(message)) // 4
        total = self.total_tokens if self.total_tokens is not None else prompt + completion
        return {"prompt_tokens": prompt, "completion_tokens": total - prompt,
                "total_tokens": total}  # fmt: skip


class _Server(RecordingServer):
    fake: FakeOpenAI


class _Handler(QuietHandler):
    server: _Server

    def do_GET(self) -> None:
        fake = self.server.fake
        fake.record(Recorded("GET", self.path, dict(self.headers), None))
        if self.path.rstrip("/") == "/v1/models":
            models = {"object": "list", "data": [{"id": fake.model, "object": "model"}]}
            self._send(200, json.dumps(models))
        else:
            self._send(404, '{"error": {"message": "not found"}}')

    def do_POST(self) -> None:
        fake = self.server.fake
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        reply = fake.record(Recorded("POST", self.path, dict(self.headers), body))
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, '{"error": {"message": "not found"}}')
            return
        refused = [k for k in fake.unsupported if isinstance(body, dict) and k in body]
        if refused:  # as OpenAI answers `max_tokens` sent to a reasoning model
            self._send(400, json.dumps({"error": {
                "message": f"Unsupported parameter: '{refused[0]}' is not supported with this"
                           " model.", "type": "invalid_request_error", "param": refused[0],
                "code": "unsupported_parameter"}}))  # fmt: skip
            return
        self._answer(reply if reply is not None else fake.default_reply(body), body)

    def _answer(self, reply: Reply, body: Any) -> None:
        fake = self.server.fake
        if isinstance(reply, Delay):
            if fake.stopping.wait(reply.seconds):
                return
            self._answer(reply.then or fake.default_reply(body), body)
        elif isinstance(reply, Status):
            extra = {"Retry-After": reply.retry_after} if reply.retry_after is not None else {}
            self._send(reply.code, reply.body, extra)
        elif isinstance(reply, RawBody):
            self._send(reply.status, reply.body, {"Content-Type": reply.content_type})
        else:
            self._send(200, json.dumps(self._completion(reply, body)))

    def _completion(
        self, reply: ToolCall | ToolCalls | Content | Refusal | Ended, body: Any
    ) -> dict[str, Any]:
        fake = self.server.fake
        message = _message(reply.then if isinstance(reply, Ended) else reply)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        if isinstance(reply, Ended):
            finish = reply.finish_reason
            if reply.reasoning is not None:
                message["reasoning_content"] = reply.reasoning
        out: dict[str, Any] = {
            "id": f"chatcmpl-fake-{len(fake.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": fake.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
        if fake.report_usage:
            out["usage"] = fake.usage(body, message)
        return out

    def _send(self, code: int, text: str, headers: dict[str, str] | None = None) -> None:
        data = text.encode("utf-8")
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        self.send_response(code)
        for name, value in all_headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _message(reply: ToolCall | ToolCalls | Content | Refusal) -> dict[str, Any]:
    if isinstance(reply, Content):
        return {"role": "assistant", "content": reply.text}
    if isinstance(reply, Refusal):
        return {"role": "assistant", "content": None, "refusal": reply.text}
    calls = reply.calls if isinstance(reply, ToolCalls) else (reply,)
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments if isinstance(c.arguments, str)
                          else json.dumps(c.arguments)}}
            for i, c in enumerate(calls)
        ],
    }  # fmt: skip


# ---- default answers -----------------------------------------------------------------------


def _answer_as(body: Any, name: str, params: dict[str, Any], confidence: float, why: str) -> Reply:
    """A tool call when the request offers tools, else a json_schema decision."""
    if isinstance(body, dict) and body.get("tools"):
        return ToolCall(name, {**params, "confidence": confidence, "rationale": why})
    return decision(name, params, confidence, why)


def _escalate(body: Any) -> Reply:
    reason = "a person should look at this"
    return _answer_as(body, "escalate_to_human", {"reason": reason}, 0.3, "Not sure; escalating.")


def _offered(body: Any) -> set[str]:
    if not isinstance(body, dict):
        return set()
    if body.get("tools"):
        return {t["function"]["name"] for t in body["tools"]}
    schema = body.get("response_format", {}).get("json_schema", {}).get("schema", {})
    return set(schema.get("properties", {}).get("action", {}).get("enum", []))


_SUBJECT = re.compile(r'^subject: "instance:([^"\\]+)"$', re.MULTILINE)
_DATA = re.compile(r"^BEGIN DATA (\w+)$(.*)^END DATA \1$", re.MULTILINE | re.DOTALL)


def _user_prompt(body: Any) -> str:
    messages = body.get("messages", []) if isinstance(body, dict) else []
    users = [m.get("content") or "" for m in messages if m.get("role") == "user"]
    return str(users[-1]) if users else ""


def _smart(body: Any) -> Reply:
    """Replace a frozen subject when `replace` is offered; otherwise escalate_to_human."""
    data = _DATA.search(_user_prompt(body))
    block = data.group(2) if data else ""
    subject = _SUBJECT.search(block)
    if subject and '"status": "frozen"' in block and "replace" in _offered(body):
        params = {"instance": subject.group(1)}
        return _answer_as(body, "replace", params, 0.85, "Frozen after a reboot: replace it.")
    return _escalate(body)
