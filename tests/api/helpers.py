"""What several API test modules share: /metrics read as samples."""

from prometheus_client.parser import text_string_to_metric_families


def scrape(client) -> dict[tuple[str, frozenset], float]:
    """Every sample of /metrics by (name, labels)."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))
