"""`kvchat serve` against DNS rebinding and doubled credentials: the Host header is checked on loopback
(app/server/guards.py's HostCheck), and two Authorization headers are refused whichever one is right."""

from __future__ import annotations

import httpx
import pytest

from app.server.guards import allowed_host_names, host_name
from tests.app.server.serve_child import ServeChild

API_KEY = "k"
pytestmark = pytest.mark.xdist_group("serve-host")  # one xdist worker starts the server (make test: --dist loadgroup)


@pytest.fixture(scope="module")
def child(tiny_model_dir, tmp_path_factory):
    """`kvchat serve` on 127.0.0.1 with an API key, also answering to my.box."""
    with ServeChild(tiny_model_dir, tmp_path_factory.mktemp("serve") / "stderr", "--allowed-host", "my.box",
                    "--api-key", API_KEY) as running:
        yield running


def get_models(child: ServeChild, headers: list[tuple[str, str]]) -> httpx.Response:
    """GET /v1/models with exactly `headers` (a given Host replaces httpx's; a name may repeat)."""
    with httpx.Client(timeout=10) as client:
        return client.send(httpx.Request("GET", f"{child.url}/models", headers=headers))


def authorized(host: str) -> list[tuple[str, str]]:
    return [("Host", host), ("Authorization", f"Bearer {API_KEY}")]


@pytest.mark.slow  # a `kvchat serve` process
def test_a_host_naming_another_site_is_refused_on_loopback_in_one_sentence(child):
    response = get_models(child, authorized(f"rebound.example:{child.port}"))
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "host_not_allowed"
    assert error["message"] == ("This server does not answer to the Host 'rebound.example'; start it with "
                                "--allowed-host rebound.example to allow it.")


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "127.0.0.1", "localhost:{port}", "LocalHost", "my.box:{port}",
                                  "my.box"])
@pytest.mark.slow  # a `kvchat serve` process
def test_the_bound_address_localhost_and_allowed_hosts_are_answered(child, host):
    assert get_models(child, authorized(host.format(port=child.port))).status_code == 200


@pytest.mark.slow  # a `kvchat serve` process
def test_two_authorization_headers_are_refused_even_when_one_is_right(child):
    for pair in (["Bearer wrong", f"Bearer {API_KEY}"], [f"Bearer {API_KEY}", "Bearer wrong"]):
        response = get_models(child, [("Host", "127.0.0.1")] + [("Authorization", value) for value in pair])
        assert response.status_code == 400
        assert response.json()["error"]["message"] == "Send one Authorization header, not 2."


def test_the_check_covers_ipv6_loopback_and_applies_elsewhere_only_with_allowed_hosts():
    assert allowed_host_names("::1", "::1", []) == {"[::1]", "localhost"}
    assert allowed_host_names("localhost", "127.0.0.1", ["Box.Lan:9000"]) == {"localhost", "127.0.0.1", "box.lan"}
    assert allowed_host_names("0.0.0.0", "0.0.0.0", []) is None  # any Host: names this machine cannot know
    assert allowed_host_names("0.0.0.0", "0.0.0.0", ["gpu-box"]) == {"0.0.0.0", "gpu-box"}
    assert host_name("[::1]:8000") == "[::1]" and host_name("LocalHost.:80") == "localhost"
