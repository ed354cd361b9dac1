"""gateway.web.guard: which Host headers and origins are the gateway's own, bounded JSON."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from gateway.config import ConfigError
from gateway.web.guard import MAX_JSON_DEPTH, BadBody, HostPolicy, loads_json
from tests.conftest import MakeConfig


def test_host_policy_on_loopback_accepts_only_our_names() -> None:
    policy = HostPolicy("127.0.0.1", ["bot.example.com"])
    for ok in ("127.0.0.1:8787", "localhost", "LOCALHOST:1", "[::1]:8787", "127.0.0.2",
               "bot.example.com", "Bot.Example.com:443", None):
        assert policy.host_ok(ok), ok
    for bad in ("evil.example", "127.0.0.1.evil.example", "localhost.evil.example", "10.0.0.5",
                "evil.example:8787", "localhost:notaport", "[::1", ""):
        assert not policy.host_ok(bad), bad


def test_host_policy_on_every_address_accepts_any_ip_but_no_foreign_name() -> None:
    policy = HostPolicy("0.0.0.0")
    assert policy.host_ok("10.0.0.5:8787") and policy.host_ok("[2001:db8::1]:80")
    assert not policy.host_ok("evil.example")


def test_the_telegram_webhook_host_and_allowed_hosts_are_ours(make_config: MakeConfig) -> None:
    config = make_config(
        web={"allowed_hosts": ["Admin.Example.org"]},
        channels={"telegram": {"enabled": True, "token": "1:x", "mode": "webhook",
                               "webhook_url": "https://u:p@bot.example.org:8443/telegram/webhook",
                               "webhook_secret": "s"}},
    )
    policy = HostPolicy.for_config(config)
    assert policy.host_ok("bot.example.org") and policy.host_ok("admin.example.org:443")
    assert not policy.host_ok("example.org")
    with pytest.raises(ConfigError, match="not a host name"):
        make_config(web={"allowed_hosts": ["https://bot.example.org/"]})


@pytest.mark.parametrize(
    ("headers", "verdict"),
    [
        ({}, None),
        ({"Origin": "http://127.0.0.1:8787"}, False),
        ({"Referer": "http://127.0.0.1:8787/admin/pairing"}, False),
        ({"Origin": "https://admin.example.org"}, False),  # a proxy's public name
        ({"Origin": "http://127.0.0.1:9999"}, True),  # another local service
        ({"Origin": "https://evil.example"}, True),
        ({"Origin": "null"}, True),
        ({"Origin": "file://"}, True),
        ({"Referer": "https://evil.example/x"}, True),
        ({"Origin": "https://evil.example", "Referer": "http://127.0.0.1:8787/"}, True),
    ],
)
def test_cross_site(headers: dict[str, str], verdict: bool | None) -> None:
    policy = HostPolicy("127.0.0.1", ["admin.example.org"])
    request = make_mocked_request("POST", "/admin/logout", headers={"Host": "127.0.0.1:8787",
                                                                    **headers})
    assert policy.cross_site(request) is verdict


def test_loads_json_is_bounded() -> None:
    assert loads_json(b'{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}
    nested = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads_json(nested)
    for bad in ("[" + nested + "]", "[" * 100_000, b"\xff", "{x", "1" * 5_000):
        with pytest.raises(BadBody) as caught:
            loads_json(bad)
        assert caught.value.status == 400
