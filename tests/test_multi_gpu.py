"""benchmarks/multi_gpu.py under torchrun with two processes: DDP ranks identical, FSDP2
matching one process, the fused backends taken on every rank, a DDP step captured in a
CUDA graph (GPUs), torch.compile over the DDP-wrapped model. On 2 GPUs over NCCL
(gpu-marked), and on the CPU over gloo at toy shapes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "multi_gpu.py")


def _launch(tmp_path, *args, timeout) -> dict:
    out = tmp_path / "multi.jsonl"
    env = dict(os.environ)
    # this checkout's package, ahead of any installed copy
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [env.get("PYTHONPATH")])])
    env.pop("TRITON_INTERPRET", None)  # conftest's CPU setting; the script runs as users do
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", SCRIPT, "--out", str(out), *args]
    # a session of its own: on a timeout the launcher and both ranks go together
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"torchrun ran past {timeout} s:\n{stdout[-4000:]}\n{stderr[-4000:]}")
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{stdout[-4000:]}" \
                                 f"\n{stderr[-4000:]}"
    from fusedmlp_xpu.bench import results

    (result,) = results.documents(results.read(str(out))).values()  # the one run
    assert result["log"], "rank 0 kept no log in the run record"
    return result


def _check(result, device_type):
    assert result["env"]["world_size"] == 2
    assert [r["config"] for r in result["records"]] == ["narrow-w64", "narrow-w128"]
    for r in result["records"]:
        c = r["config"]
        ddp, fsdp, graph, comp = r["ddp"], r["fsdp"], r["cuda_graph"], r["compile"]
        assert ddp["ranks_identical"] and ddp["finite"], f"{c}: DDP ranks diverged: {ddp}"
        assert fsdp["ranks_identical"], f"{c}: FSDP2's gathered parameters differ by rank"
        assert fsdp["update_rel"] > 1e-4, f"{c}: the steps did not move the parameters: {fsdp}"
        assert fsdp["match"], (f"{c}: FSDP2 vs one process: rel errors "
                               f"{fsdp['rel_error_ranks']} > {fsdp['tolerance']}")
        assert r["backends_ok"], f"{c}: backends {r['ddp']['backends']}"
        names = r["ddp"]["backends"]["narrow"] + r["ddp"]["backends"]["gated"]
        assert len(names) == 4
        if device_type == "cpu":
            assert set(names) == {"reference"}, names  # the automatic choice on the CPU
            # fp32: the error is also small against the parameters' movement, so a wrong
            # gradient cannot hide in the tolerance relative to the parameters themselves
            assert fsdp["rel_error_of_update"] < 1e-3, f"{c}: {fsdp}"
            assert graph["ok"] is None and graph["skipped"], graph
        else:
            assert "reference" not in names, names
            assert graph["ok"], f"{c}: CUDA-graph capture of a DDP step: {graph}"
        assert comp["ok"], f"{c}: torch.compile over DDP: {comp}"
        assert abs(comp["loss"] - comp["loss_eager"]) <= 2e-2 * abs(comp["loss_eager"]), comp
        for kind in ("single", "ddp", "fsdp"):
            assert r[kind]["time"]["median_ms"] > 0
        assert set(r["scaling_efficiency"]) == {"ddp", "fsdp"}
        assert all(v > 0 for v in r["scaling_efficiency"].values())


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="torch.distributed with the gloo backend is not available in this build")
def test_multi_gpu_script_on_cpu_gloo(tmp_path):
    result = _launch(tmp_path, "--device", "cpu", "--tiny", "--steps", "5", "--repeats", "3",
                     timeout=300)
    assert result["env"]["dist_backend"] == "gloo"
    _check(result, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason=f"needs 2 CUDA GPUs, found {torch.cuda.device_count()}")
def test_multi_gpu_script_on_two_gpus_nccl(tmp_path):
    result = _launch(tmp_path, "--steps", "10", "--repeats", "3", timeout=900)
    assert result["env"]["dist_backend"] == "nccl"
    assert result["env"]["NCCL_NVLS_ENABLE"] == "0"
    _check(result, "cuda")
