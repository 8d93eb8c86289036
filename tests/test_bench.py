"""The benches (`python -m app.bench NAME`): their pure parts table-driven, and each bench's --short run, checked
only for well-formed output (a markdown table, JSON with the expected keys, a PNG), never for a speed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.bench import links, netns
from app.bench.allreduce import bus_bandwidth, parse_size, size_label
from app.bench.container_vs_host import round_rows
from app.bench.peers import ALONE, parse_variant, peer_rows
from app.bench.ps_vs_ring import model_ratio, model_seconds, within_tolerance
from app.bench.report import markdown_table, write_report
from app.bench.tf_peers import peer_row
from tests.docker_image import image_missing
from tests.extras import needs

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("algbw, ranks, busbw", [(1.0, 2, 1.0), (1.0, 4, 1.5), (2.0, 8, 3.5), (1.0, 1, 0.0)])
def test_bus_bandwidth(algbw, ranks, busbw):
    assert bus_bandwidth(algbw, ranks) == pytest.approx(busbw)


@pytest.mark.parametrize(
    "text, size, label",
    [
        ("4K", 4096, "4 KB"),
        ("256M", 256 << 20, "256 MB"),
        ("1G", 1 << 30, "1 GB"),
        ("100", 100, "100 B"),
        ("64kb", 65536, "64 KB"),
    ],
)
def test_sizes(text, size, label):
    assert parse_size(text) == size
    assert size_label(size) == label


@pytest.mark.parametrize(
    "ranks, ps_ms, ring_ms, ratio", [(2, 640.0, 320.0, 2.0), (4, 1920.0, 480.0, 4.0), (8, 4480.0, 560.0, 8.0)]
)
def test_cost_model_8mb_at_200mbit(ranks, ps_ms, ring_ms, ratio):
    assert model_seconds("ps", ranks, 8, 200) * 1e3 == pytest.approx(ps_ms)
    assert model_seconds("ring", ranks, 8, 200) * 1e3 == pytest.approx(ring_ms)
    assert model_ratio(ranks) == pytest.approx(ratio)


@pytest.mark.parametrize(
    "ratio, expected, ok", [(1.96, 2, True), (3.41, 4, True), (3.39, 4, False), (9.19, 8, True), (9.21, 8, False)]
)
def test_within_tolerance(ratio, expected, ok):
    assert within_tolerance(ratio, expected) is ok


@pytest.mark.parametrize(
    "text, variant",
    [
        ("c=hvd-gloo:HOROVOD_CYCLE_TIME=0.2", ("c", "hvd-gloo", {"HOROVOD_CYCLE_TIME": "0.2"})),
        ("plain=hvd-mpi", ("plain", "hvd-mpi", {})),
        ("two=ddp:A=1,B=x=y", ("two", "ddp", {"A": "1", "B": "x=y"})),
    ],
)
def test_parse_variant(text, variant):
    assert parse_variant(text) == variant


def test_parse_variant_rejects_unknown_peer():
    with pytest.raises(Exception, match="PEER one of"):
        parse_variant("x=nccl")


def test_peer_rows_take_the_ratio_and_the_scaling_efficiency_within_each_round():
    def jobs(*rates):
        return [{"samples_per_sec": r, "step_s": 128 / r, "cpu_s_per_step": 0.01} for r in rates]

    results = {("m", ALONE): jobs(60, 40), ("m", "ddp"): jobs(100, 50), ("m", "hvd"): jobs(90, 50)}
    rows = peer_rows(results, ["m"], ["ddp", "hvd"], ranks=2)
    assert [row["config"] for row in rows] == [ALONE, "ddp", "hvd"]
    alone, ddp, hvd = rows
    assert (hvd["ratio_min"], hvd["ratio_max"], hvd["ratio_to_ddp"]) == (0.9, 1.0, pytest.approx(0.95))
    assert (hvd["samples_min"], hvd["samples_max"]) == (50, 90)
    # round 1: 90 / (2 x 60) = 0.75; round 2: 50 / (2 x 40) = 0.625
    assert (hvd["efficiency_min"], hvd["efficiency_max"]) == (0.625, 0.75)
    assert hvd["scaling_efficiency"] == pytest.approx(0.6875)
    assert ddp["scaling_efficiency"] == pytest.approx((100 / 120 + 50 / 80) / 2)
    assert alone["ratio_to_ddp"] is None and alone["scaling_efficiency"] is None


def test_tf_peer_row_takes_horovods_speed_up_within_each_round():
    row = peer_row("m", {"hvd-tf": [0.010, 0.020, 0.012], "mwms": [0.015, 0.020, 0.024]}, global_batch=64)
    assert row["speedup"] == pytest.approx(1.5)  # rounds: 1.5, 1.0, 2.0
    assert row["hvd-tf_ms"] == pytest.approx(12.0) and row["hvd-tf_spread"] == "10.0-20.0"
    assert row["mwms_throughput"] == pytest.approx(64 / 0.020)


def test_container_vs_host_rounds_take_the_ratio_within_each_round():
    rows = round_rows([((100.0, 0.9), (80.0, 0.91)), ((50.0, 0.9), (50.0, 0.92)), ((90.0, 0.9), (45.0, 0.93))], "c")
    host, containers = rows
    assert host["ratio_to_host"] == 1.0 and containers["run"] == "c"
    assert (containers["ratio_to_host"], containers["ratio_min"], containers["ratio_max"]) == (0.8, 0.5, 1.0)
    assert (containers["samples_per_sec"], containers["samples_min"], containers["samples_max"]) == (50, 45, 80)
    assert containers["val_accuracy"] == 0.93


@pytest.mark.parametrize(
    "text, mbit, label",
    [
        ("1gbit", 1000.0, "1gbit"),
        ("200mbit", 200.0, "200mbit"),
        ("200", 200.0, "200mbit"),
        ("500kbit", 0.5, "0.5mbit"),
        ("2.5Gbit", 2500.0, "2500mbit"),
        ("10gbit", 10000.0, "10gbit"),
    ],
)
def test_link_rates(text, mbit, label):
    assert links.parse_rate(text) == mbit
    assert links.rate_label(mbit) == label


@pytest.mark.parametrize("text", ["fast", "0mbit", "-1gbit", "1 tbit"])
def test_link_rates_refused(text):
    with pytest.raises(Exception, match="is not a link rate: e.g. 200mbit or 1gbit"):
        links.parse_rate(text)


@pytest.mark.parametrize(
    "setting, rate, seconds",
    [
        ("fp32", 200.0, 46.8 * 8 / 200),  # the ring on 2 ranks: M/B
        ("fp16", 200.0, 46.8 * 8 / 200 / 2),
        ("adasum", 1000.0, 46.8 * 8 / 1000),
        ("fusion-0", 1000.0, 46.8 * 8 / 1000),
    ],
)
def test_predicted_exchange_is_the_ring_model_for_the_bytes_on_the_wire(setting, rate, seconds):
    assert links.predicted_exchange_s(46.8, setting, rate) == pytest.approx(seconds)


@pytest.mark.parametrize("round_, order", [(0, ["a", "b", "c"]), (1, ["b", "c", "a"]), (4, ["b", "c", "a"])])
def test_each_round_starts_one_setting_further_on(round_, order):
    assert links.rotated(["a", "b", "c"], round_) == order


def test_link_rows_hold_each_setting_against_fp32_within_each_round_and_the_prediction_against_the_measure():
    def jobs(*rates, exchange=1.0):
        return [{"samples_per_sec": r, "step_s": 128 / r, "exchange_s": exchange, "gradient_mb": 46.8} for r in rates]

    results = {
        (200.0, "resnet18", links.COMPUTE): [{"step_s": 0.25}, {"step_s": 0.27}],
        (200.0, "resnet18", "fp32"): jobs(60, 40, exchange=2.0),
        (200.0, "resnet18", "fp16"): jobs(90, 80, exchange=1.0),
    }
    rows = links.link_rows(results)
    assert [row["setting"] for row in rows] == ["fp32", "fp16"]
    fp32, fp16 = rows
    assert set(fp16) >= {"rate", "model", "setting", "samples_per_s", "predicted_exchange_s", "measured_exchange_s"}
    assert (fp16["rate"], fp16["model"], fp16["rate_mbit"]) == ("200mbit", "resnet18", 200.0)
    assert fp16["vs_fp32"] == pytest.approx((90 / 60 + 80 / 40) / 2)  # 1.5 and 2.0, per round
    assert (fp16["samples_per_s"], fp16["samples_min"], fp16["samples_max"]) == (85, 80, 90)
    assert fp32["predicted_exchange_s"] == pytest.approx(1.872) and fp32["measured_exchange_s"] == 2.0
    assert fp32["prediction_error"] == pytest.approx(1.872 / 2.0 - 1)
    assert fp32["compute_s"] == pytest.approx(0.26) and fp32["exposed_exchange_s"] == pytest.approx(
        (128 / 60 + 128 / 40) / 2 - 0.26
    )
    json.dumps(rows)  # the --json file's rows


def test_markdown_table_right_aligns_numbers_and_marks_missing_values():
    table = markdown_table([("name", "name", ""), ("ms", "ms", ".1f")], [{"name": "a", "ms": 1.25}, {"name": "b"}])
    assert table.splitlines() == ["| name | ms |", "|---|---:|", "| a | 1.2 |", "| b | - |"]


@needs("matplotlib")
def test_write_report_writes_table_json_and_png(tmp_path, capsys):
    paths = write_report(tmp_path, "x", "title", [("a", "A", "d")], [{"a": 1}], extra={"k": 2})
    assert_report(tmp_path, "x", ["a"])
    assert json.loads(paths["json"].read_text())["k"] == 2
    assert "| A |" in capsys.readouterr().out


def assert_report(out: Path, name: str, row_keys: list[str]) -> list[dict]:
    """NAME.md is a markdown table, NAME.json holds rows with row_keys, NAME.png is a PNG."""
    lines = (out / f"{name}.md").read_text().splitlines()
    table = [line for line in lines if line.startswith("|")]
    assert len(table) >= 3 and set(table[1]) <= set("|-:")
    assert len({line.count("|") for line in table}) == 1
    rows = json.loads((out / f"{name}.json").read_text())["rows"]
    assert rows and all(key in row for row in rows for key in row_keys)
    assert len(table) == len(rows) + 2
    assert (out / f"{name}.png").read_bytes()[:8] == PNG_SIGNATURE
    return rows


def run_bench(name: str, out: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "app.bench", name, "--short", "--out", str(out), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.mark.integration
def test_peers_short(tmp_path):
    run_bench("peers", tmp_path)
    rows = assert_report(
        tmp_path, "peers", ["model", "config", "samples_per_sec", "ratio_to_ddp", "scaling_efficiency"]
    )
    assert {row["config"] for row in rows} >= {ALONE, "ddp", "hvd-mpi stack", "hvd-gloo stack"}
    assert all(row["scaling_efficiency"] > 0 for row in rows if row["config"] != ALONE)


@pytest.mark.integration
def test_allreduce_short(tmp_path):
    run_bench("allreduce", tmp_path)
    rows = assert_report(tmp_path, "allreduce", ["size", "bytes"])
    for peer in ("hvd-mpi", "hvd-gloo", "ddp"):
        assert all(row[f"{peer}_busbw"] > 0 for row in rows)


@pytest.mark.integration
def test_ps_vs_ring_loopback_short(tmp_path):
    run_bench("ps-vs-ring", tmp_path, "--loopback")
    assert_report(tmp_path, "ps-vs-ring", ["ranks", "ps_ms", "ring_ms", "ratio", "model_ratio"])


@pytest.mark.integration
@pytest.mark.skipif(netns.unavailable() is not None, reason=f"ps-vs-ring in namespaces {netns.unavailable()}")
def test_ps_vs_ring_in_namespaces_short(tmp_path):
    run_bench("ps-vs-ring", tmp_path)
    rows = assert_report(
        tmp_path, "ps-vs-ring", ["ranks", "ps_ms", "ring_ms", "ratio", "model_ratio", "within_tolerance"]
    )
    assert [row["ranks"] for row in rows] == [2, 3]
    assert not any(
        line.startswith(netns.PS_VS_RING.namespace_prefix)
        for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
    )


@pytest.mark.integration
@pytest.mark.skipif(netns.unavailable() is not None, reason=f"links in namespaces {netns.unavailable()}")
def test_links_short(tmp_path):
    """SimpleNet at 20 Mbit/s, fp32 and fp16, one round of a few steps: the table, the JSON rows, the plot."""
    result = run_bench("links", tmp_path, "--json", str(tmp_path / "rows.json"))
    print(result.stdout[result.stdout.find("###") :])
    rows = assert_report(
        tmp_path, "links", ["rate", "model", "setting", "samples_per_s", "predicted_exchange_s", "measured_exchange_s"]
    )
    assert [(row["rate"], row["setting"]) for row in rows] == [("20mbit", "fp32"), ("20mbit", "fp16")]
    assert json.loads((tmp_path / "rows.json").read_text()) == rows
    assert not any(
        line.startswith(netns.LINKS.namespace_prefix)
        for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
    )


DOCKER_IMAGE_MISSING = image_missing()


@pytest.mark.integration
@pytest.mark.skipif(DOCKER_IMAGE_MISSING is not None, reason=f"container-vs-host {DOCKER_IMAGE_MISSING}")
def test_container_vs_host_short(tmp_path):
    """A real run when Docker and the image are there (CI): host, then one `docker run` of the image."""
    run_bench("container-vs-host", tmp_path, "--containers", "run")
    assert_report(tmp_path, "container-vs-host", ["run", "samples_per_sec", "ratio_to_host"])
