"""Prices as data: every figure carries its source and the date it was read; stacks may override any.

Keys name what is billed:

- ``compute.<platform>.gpu`` / ``.vcpu`` / ``.ram``: separately billed GPU-hour, vCPU-hour, GiB-hour
  (L40S and CPU platforms).
- ``compute.<platform>.bundled``: one price per GPU-hour covering GPU, vCPU and RAM (Nebius bills
  H100/H200/B200 VMs this way since 2025-10-01).
- ``disk.<TYPE>``, ``filesystem.<TYPE>``, ``object_storage.standard``: per GiB-month.
- ``network.public_ip``: per address-hour.

A month is 730 hours (Nebius's own pricing unit for storage: "1 GiB per 730 hours").
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from planning import catalog

HOURS_PER_MONTH = 730

SEED_000 = "seed 000 (InnovationBank demo TCO, prices from nebius.com when the demo was prepared)"
SEED_000_DATE = "2025-06-01"
NEBIUS_BILLING_OCT_2025 = "https://docs.nebius.com/signup-billing/billing-changes-oct-2025"
NEBIUS_OBJECT_STORAGE = "https://docs.nebius.com/object-storage/resources/pricing"
OPSLYFT_H100 = (
    "https://www.opslyft.com/blog/nebius-vs-aws-gpu-cost-allocation (third-party table of "
    "nebius.com/prices read 2026-05-18; not checked against nebius.com here)"
)


class Price(BaseModel):
    """One billed item: on-demand USD per unit, the preemptible USD where known, and provenance."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)

    usd: float = Field(ge=0)
    unit: str
    source: str
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$", description="ISO date the figure was read or took effect")
    preemptible_usd: float | None = Field(None, ge=0)


def _p(usd: float, unit: str, source: str, date: str, preemptible: float | None = None) -> Price:
    return Price(usd=usd, unit=unit, source=source, date=date, preemptible_usd=preemptible)


def _separate(platform: str, gpu: float | None, vcpu: float, source: str, date: str) -> dict[str, Price]:
    prices = {
        f"compute.{platform}.vcpu": _p(vcpu, "vCPU-hour", source, date),
        f"compute.{platform}.ram": _p(0.0032, "GiB-hour", source, date),
    }
    if gpu is not None:
        prices[f"compute.{platform}.gpu"] = _p(gpu, "GPU-hour", source, date)
    return prices


_ASSUMED_SAME = "assumed equal to {other} (no public figure found here); override per stack"

CATALOG: Mapping[str, Price] = MappingProxyType({
    **_separate("gpu-l40s-d", 1.35, 0.01, SEED_000, SEED_000_DATE),
    **_separate("gpu-l40s-a", 1.35, 0.01, _ASSUMED_SAME.format(other="gpu-l40s-d"), SEED_000_DATE),
    **_separate("cpu-d3", None, 0.012, SEED_000, SEED_000_DATE),
    **_separate("cpu-e2", None, 0.012, _ASSUMED_SAME.format(other="cpu-d3"), SEED_000_DATE),
    "compute.gpu-h100-sxm.bundled": _p(2.95, "GPU-hour (GPU+vCPU+RAM)", OPSLYFT_H100, "2026-05-18", 1.25),
    "compute.gpu-h200-sxm.bundled": _p(3.50, "GPU-hour (GPU+vCPU+RAM)", NEBIUS_BILLING_OCT_2025, "2025-10-22"),
    "disk.NETWORK_SSD": _p(0.071, "GiB-month", SEED_000, SEED_000_DATE),
    "disk.NETWORK_SSD_NON_REPLICATED": _p(0.053, "GiB-month", SEED_000, SEED_000_DATE),
    "filesystem.NETWORK_SSD": _p(0.08, "GiB-month", SEED_000, SEED_000_DATE),
    "object_storage.standard": _p(0.0147, "GiB-month", NEBIUS_OBJECT_STORAGE, "2025-10-22"),
    "network.public_ip": _p(0.0, "address-hour", SEED_000, SEED_000_DATE),
})


class PriceOverride(BaseModel):
    """A stack's own figure for one price key (e.g. a negotiated rate)."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)

    usd: float = Field(ge=0)
    source: str = "stack override"
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    preemptible_usd: float | None = Field(None, ge=0)


class ChatAssumptions(BaseModel):
    """Cost-per-chat scenarios (seed 000): throughputs and days per month. The output tokens of a chat are the
    run config's serve.max_tokens_limit, what the server allows (infra.cost.run_size.chat_output_tokens)."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)

    tokens_per_second: list[float] = Field([3.8, 60.0, 200.0], min_length=1)
    days_per_month: float = Field(30.0, gt=0, description="daily cluster cost = monthly high / this")

    @field_validator("tokens_per_second")
    @classmethod
    def _positive(cls, value: list[float]) -> list[float]:
        if any(v <= 0 for v in value):
            raise ValueError("every throughput must be > 0 tokens/s")
        return value


class TrainingAssumptions(BaseModel):
    """Inputs of the training-run estimate that the run config does not hold."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)

    tokens_per_second_per_gpu: float | None = Field(
        None, gt=0, description="training throughput; default: the last run's metrics.jsonl"
    )
    avg_tokens_per_row: float | None = Field(
        None, gt=0, description="without a tokenized dataset; default the run config's data.max_length (upper bound)"
    )


class ScheduleAssumptions(BaseModel):
    """The schedule elastic workers are priced at beside always-on (infra/cost/utilization.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)

    runs_per_month: float = Field(52 / 12, ge=0, description="pipeline runs a month; default a weekly retrain")
    serving_nodes: int = Field(1, ge=0, description="worker nodes kept up for serving")
    serving_hours_per_month: float = Field(HOURS_PER_MONTH, ge=0, le=HOURS_PER_MONTH,
                                           description="hours a month those nodes serve")
    requeue_overhead: float = Field(
        0.15, ge=0, description="on preemptible workers, the expected extra run time (work redone since the last "
        "checkpoint and restarts after preemptions) as a fraction of the run's time; an assumption, not measured")


def valid_price_key(key: str) -> bool:
    parts = key.split(".")
    if parts[0] == "compute":
        return len(parts) == 3 and parts[2] in ("gpu", "vcpu", "ram", "bundled")
    return len(parts) == 2 and parts[0] in ("disk", "filesystem", "object_storage", "network")


class PricingConfig(BaseModel):
    """The stack's ``pricing`` section: price overrides and the assumptions of the cost model."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)

    overrides: dict[str, PriceOverride] = {}
    artifacts_gib: float = Field(1.0, ge=0, description="expected size of the artifacts bucket")
    chat: ChatAssumptions = ChatAssumptions()
    training: TrainingAssumptions = TrainingAssumptions()
    schedule: ScheduleAssumptions = ScheduleAssumptions()

    @field_validator("overrides")
    @classmethod
    def _known_keys(cls, value: dict[str, PriceOverride]) -> dict[str, PriceOverride]:
        for key in value:
            if not valid_price_key(key):
                raise ValueError(
                    f"unknown price key {key!r}: use compute.<platform>.gpu|vcpu|ram|bundled, disk.<TYPE>, "
                    "filesystem.<TYPE>, object_storage.standard or network.public_ip"
                )
        return value


class MissingPrice(KeyError):
    """No catalog figure and no stack override for a billed item."""

    def __str__(self) -> str:
        key = self.args[0]
        return (f"no price for {key!r}: add soperator-finetune:pricing.overrides.{key} "
                "(usd, date, source) to the stack file")


class PriceBook:
    """The catalog with a stack's overrides applied."""

    def __init__(self, overrides: Mapping[str, PriceOverride] | None = None) -> None:
        prices = dict(CATALOG)
        for key, o in (overrides or {}).items():
            unit = CATALOG[key].unit if key in CATALOG else "as billed"
            prices[key] = Price(usd=o.usd, unit=unit, source=o.source, date=o.date, preemptible_usd=o.preemptible_usd)
        self.prices: Mapping[str, Price] = MappingProxyType(prices)

    def get(self, key: str) -> Price:
        try:
            return self.prices[key]
        except KeyError:
            raise MissingPrice(key) from None

    def has(self, key: str) -> bool:
        return key in self.prices

    def newest_date(self, keys: set[str]) -> str:
        return max((self.get(k).date for k in keys), default=SEED_000_DATE)


class NodePrice(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    usd_per_hour: float
    price_keys: tuple[str, ...]
    note: str = ""


def node_price(platform: str, preset: str, book: PriceBook, *, preemptible: bool = False) -> NodePrice:
    """Hourly price of one node; preemptible uses the preemptible figure where every part has one."""
    shape = catalog.get_preset(platform, preset)
    bundled = f"compute.{platform}.bundled"
    if book.has(bundled):
        parts = [(book.get(bundled), shape.gpus, bundled)]
    else:
        parts = [
            (book.get(f"compute.{platform}.vcpu"), shape.vcpus, f"compute.{platform}.vcpu"),
            (book.get(f"compute.{platform}.ram"), shape.ram_gib, f"compute.{platform}.ram"),
        ]
        if shape.gpus:
            parts.insert(0, (book.get(f"compute.{platform}.gpu"), shape.gpus, f"compute.{platform}.gpu"))
    note = ""
    use_preemptible = preemptible and all(p.preemptible_usd is not None for p, _, _ in parts)
    if preemptible and not use_preemptible:
        note = "no preemptible price known: priced on demand"
    usd = sum((p.preemptible_usd if use_preemptible else p.usd) * n for p, n, _ in parts)
    return NodePrice(usd_per_hour=usd, price_keys=tuple(k for _, _, k in parts), note=note)
