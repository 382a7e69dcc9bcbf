"""Requests to a served engine as the server's tests send them, the Generations they start, and the check that
none still holds blocks."""

import json

import httpx

HANG_GUARD_S = 10  # far above what any of these takes; only there so a regression fails instead of hanging


def chat(engine, content: str = "hi", **fields) -> dict:
    return {"model": engine.info.model_name, "messages": [{"role": "user", "content": content}], **fields}


def post(server, path: str, body: dict | bytes, timeout: float = HANG_GUARD_S) -> httpx.Response:
    """POST `body` to /v1/`path`; a dict goes as ASCII JSON, so a lone surrogate travels as its escape."""
    content = body if isinstance(body, bytes) else json.dumps(body)
    return httpx.post(f"{server.url}/v1/{path}", content=content, timeout=timeout,
                      headers={"Content-Type": "application/json"})


def recorded_generations(engine, monkeypatch) -> list:
    """Every Generation `engine` starts from now on (a test's fixture): a request's prompt ids, params, counts."""
    made, generate = [], engine.generate
    monkeypatch.setattr(engine, "generate", lambda *a, **k: made.append(generate(*a, **k)) or made[-1])
    return made


def no_request_holds_blocks(engine) -> bool:
    cache = engine.prefix_cache
    try:
        cache.check_invariants()  # every device block is free or in the tree: none owned by a request
    except AssertionError:
        return False
    return all(node.refs == 0 for node in cache.nodes())
