"""`kvchat serve` against what tries to break it. Every wait is bounded; nothing here times the server's speed."""

from __future__ import annotations

import socket

import pytest

from app.cli import main
from engine import Engine


# The address is taken before the model loads.

@pytest.fixture
def no_model_load(monkeypatch):
    def load(*_args, **_kwargs):
        raise AssertionError("the model loaded before the address was checked")

    monkeypatch.setattr(Engine, "load", load)


def test_serve_on_a_port_in_use_is_one_sentence_and_exit_1_before_the_model_loads(tiny_model_dir, no_model_load,
                                                                                   capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code = main(["serve", "--model", str(tiny_model_dir), "--port", str(taken.getsockname()[1])])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("kvchat: 127.0.0.1:") and "already in use" in err and err.count("\n") == 1


def test_serve_on_an_address_not_of_this_machine_is_one_sentence_and_exit_1(tiny_model_dir, no_model_load, capsys):
    # 192.0.2.1 is TEST-NET-1: never a local address, and no name lookup is needed to find that out.
    code = main(["serve", "--model", str(tiny_model_dir), "--host", "192.0.2.1", "--port", "8000"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("kvchat: cannot listen on 192.0.2.1:8000") and err.count("\n") == 1
