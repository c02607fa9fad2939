import ipaddress
import socket

import pytest

from queueapp.webhooks.ssrf import (
    HostNotResolved,
    RefusedAddress,
    check_literal,
    refusal,
    resolve_allowed,
)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://[::1]/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://192.168.1.5:8080/hook",
        "http://100.64.0.7/",
        "http://[::ffff:127.0.0.1]/",
        "http://0.0.0.0/",
        "http://224.0.0.1/",
        # Not global, though Python 3.11 calls 6to4 and site-local global.
        "http://[2002:7f00:1::]/",  # 6to4 of 127.0.0.1
        "http://[2002:a00:1::]/",  # 6to4 of 10.0.0.1
        "http://[fec0::1]/",  # site-local
        "http://[fd00::1]/",  # unique local
        "http://[2001:db8::1]/",  # documentation
        "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",  # Teredo
        "http://[64:ff9b::7f00:1]/",  # NAT64 of 127.0.0.1
        "http://[ff0e::1]/",  # global-scope multicast
        "http://198.18.0.1/",  # benchmarking
        "http://240.0.0.1/",  # reserved
        "http://192.0.2.1/",  # documentation
    ],
)
def test_literal_addresses_inside_the_networks_are_refused(url, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    with pytest.raises(RefusedAddress):
        check_literal(url)


def test_public_addresses_and_names_pass_the_literal_check(settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    check_literal("https://93.184.216.34/hook")
    check_literal("https://[2606:4700::1111]/hook")
    check_literal("https://hooks.example.com/x")  # resolved at delivery


def test_a_name_that_resolves_to_loopback_is_refused_at_delivery(settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    with pytest.raises(RefusedAddress, match="loopback"):
        resolve_allowed("localhost", 80)


def test_the_allow_list_exempts_its_networks(settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    assert refusal(ipaddress.ip_address("127.0.0.1")) is None
    assert refusal(ipaddress.ip_address("::ffff:127.0.0.1")) is None
    assert refusal(ipaddress.ip_address("10.0.0.1")) is not None
    assert resolve_allowed("127.0.0.1", 80) == "127.0.0.1"


def test_the_allow_list_exempts_a_6to4_network_it_names(settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["2002::/16"]
    assert refusal(ipaddress.ip_address("2002:7f00:1::")) is None
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    assert "6to4" in refusal(ipaddress.ip_address("2002:7f00:1::"))
    assert "site-local" in refusal(ipaddress.ip_address("fec0::1"))


def test_a_name_that_does_not_resolve_is_not_a_refusal(settings, monkeypatch):
    """A DNS failure is usually temporary, so delivery retries it; a refusal is final."""

    def no_such_host(*args, **kwargs):
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    with pytest.raises(HostNotResolved) as caught:
        resolve_allowed("hooks.example.test", 443)
    assert not isinstance(caught.value, RefusedAddress)
