"""benchmarks.harness: the interleaved timing and the paired ratio that the README's ratios come from.

No timings are asserted (this is a shared machine); what is checked is the bookkeeping: every
callable gets one sample per round, the order rotates so each one runs in each position equally
often, and the paired ratio is the median of the per-round ratios.
"""

from __future__ import annotations

import statistics

from benchmarks.harness import Timing, paired_ratio, time_interleaved


def test_time_interleaved_rotates_the_order_and_samples_every_callable_each_round():
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    out = time_interleaved(fns, repeats=6, warmup=1, gap=0.0)
    assert set(out) == {"a", "b", "c"} and all(len(t.samples) == 6 for t in out.values())
    timed = calls[3:]  # after one warm-up call each
    rounds = [timed[i:i + 3] for i in range(0, 18, 3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    for position in range(3):  # each name runs first, second and third equally often
        names = [r[position] for r in rounds]
        assert all(names.count(n) == 2 for n in "abc"), names
    predecessors = {(rounds[i][j - 1], rounds[i][j]) for i in range(6) for j in range(1, 3)}
    assert ("a", "b") in predecessors and ("b", "a") in predecessors  # no fixed "always after"


def test_paired_ratio_is_the_median_of_per_round_ratios():
    ours = Timing(0, 0, 0, [1.0, 10.0, 3.0, 4.0, 5.0])
    peer = Timing(0, 0, 0, [2.0, 10.0, 1.0, 8.0, 5.0])
    assert paired_ratio(ours, peer) == statistics.median([0.5, 1.0, 3.0, 0.5, 1.0]) == 1.0
    # A slow spell that doubles both samples of a round leaves the paired ratio unchanged.
    slow = Timing(0, 0, 0, [2.0, 20.0, 3.0, 4.0, 5.0]), Timing(0, 0, 0, [4.0, 20.0, 1.0, 8.0, 5.0])
    assert paired_ratio(*slow) == paired_ratio(ours, peer)


def test_the_matmul_ceiling_is_the_best_library_in_the_process():
    """The sgemm ceiling is the fastest of the BLAS libraries the kernels and peers use (each recorded), not
    NumPy's alone: a ceiling below a kernel's own library would rate kernels over 100%."""
    from benchmarks.harness import measure_matmul_gflops

    out = measure_matmul_gflops(n=64)
    assert "numpy" in out["by_library"] and out["library"] in out["by_library"]
    assert out["gflops"] == max(out["by_library"].values())
    assert abs(out["seconds"] - out["flop"] / out["gflops"] / 1e9) < 1e-12


def test_report_rates_a_case_by_its_binding_resource(tmp_path):
    """A kernel case with both FLOPs and bytes is rated by the one nearer its ceiling (decode attention:
    memory), and the decode bound uses the bytes a step reads when the results record them."""
    import json

    from benchmarks.report import markdown

    machine = {"date": "d", "cpu": "c", "cores": 2, "numpy": "n", "numba": "b", "torch": "t",
               "env": {"OPENBLAS_CORETYPE": None}}
    ceilings = {"matmul": {"gflops": 100.0, "n": 64, "by_library": {"numpy": 100.0}},
                "bandwidth": {"gbps": 10.0, "bytes": 1 << 30}}
    (tmp_path / "ceilings.json").write_text(json.dumps({"machine": machine, "ceilings": ceilings}))
    row = {"case": "decode attention", "impl": "accel[numba]", "seconds": 1.0, "flop": 5e9, "bytes": 9e9, "extra": {}}
    (tmp_path / "kernels.json").write_text(json.dumps({"results": [row]}))
    table = markdown(tmp_path)
    assert "| 9.0 GB/s | 90% |" in table  # 9 GB/s of 10 beats 5 GFLOP/s of 100
