import ipaddress

import pytest

from queueapp.webhooks.ssrf import RefusedAddress, check_literal, refusal, resolve_allowed


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
    ],
)
def test_literal_addresses_inside_the_networks_are_refused(url, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    with pytest.raises(RefusedAddress):
        check_literal(url)


def test_public_addresses_and_names_pass_the_literal_check(settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    check_literal("https://93.184.216.34/hook")
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
