"""The instance-type catalog: data with typed records, sources and dates; facts match docs/field-notes.md
§1/§4."""

import pytest
import yaml

from infra.catalog import CATALOG_PATH, CatalogError, load_catalog, parse_catalog


def test_every_entry_has_price_provenance_and_consistent_gpu_fields():
    cat = load_catalog()
    assert len(cat.instance_types) >= 10
    for name, rec in cat.instance_types.items():
        assert rec.name == name
        assert rec.price_source and rec.price_date
        assert (rec.gpus > 0) == (rec.gpu_model is not None)
        assert rec.efa_interfaces == (rec.network_cards if rec.efa else 0)


@pytest.mark.parametrize(("name", "gpus", "model", "mem", "efa", "cards"), [
    ("p5.48xlarge", 8, "H100", 80, True, 32),
    ("p5en.48xlarge", 8, "H200", 141, True, 16),
    ("p4d.24xlarge", 8, "A100", 40, True, 4),
    ("p4de.24xlarge", 8, "A100", 80, True, 4),
    ("g5.12xlarge", 4, "A10G", 24, True, 1),
    ("g6.12xlarge", 4, "L4", 24, True, 1),
    ("g6e.12xlarge", 4, "L40S", 48, False, 1),
    ("m7i.large", 0, None, 0, False, 1),
])
def test_field_notes_facts(name, gpus, model, mem, efa, cards):
    rec = load_catalog()[name]
    got = (rec.gpus, rec.gpu_model, rec.gpu_memory_gib, rec.efa, rec.network_cards)
    assert got == (gpus, model, mem, efa, cards)


def test_prices_and_fixed_costs():
    cat = load_catalog()
    assert cat["p5.48xlarge"].on_demand_usd_per_hour == pytest.approx(55.04)
    assert cat["p4d.24xlarge"].on_demand_usd_per_hour == pytest.approx(21.96)
    assert cat.fixed_costs.eks_control_plane_usd_per_hour == pytest.approx(0.10)
    assert cat.fixed_costs.nat_gateway_usd_per_hour == pytest.approx(0.045)


def test_gpu_shape_separates_models_of_equal_memory():
    cat = load_catalog()
    assert cat["g5.12xlarge"].shape == cat["g5.24xlarge"].shape
    assert cat["g5.12xlarge"].shape != cat["g6.12xlarge"].shape  # both 4 x 24 GiB, A10G vs L4
    assert cat["p4d.24xlarge"].shape != cat["p4de.24xlarge"].shape  # A100 40 vs 80 GiB
    assert cat["p5.48xlarge"].shape.describe() == "8 x H100 80 GiB"


@pytest.mark.parametrize("breakage", [
    lambda d: d["instanceTypes"]["g5.12xlarge"].update(gpuModel=None),
    lambda d: d["instanceTypes"]["m7i.large"].update(networkCards=4),
    lambda d: d["instanceTypes"]["p5.48xlarge"].update(colour="red"),
    lambda d: d["instanceTypes"]["p5.48xlarge"].pop("priceSource"),
])
def test_malformed_catalog_is_refused(breakage):
    doc = yaml.safe_load(CATALOG_PATH.read_text())
    breakage(doc)
    with pytest.raises(CatalogError, match="catalog.yaml is malformed"):
        parse_catalog(doc)
