"""Compile the ESIMD kernels for the Max 1550 (PVC) ahead of time and check their ISA, no GPU.

    python ci/aot_sycl.py [--out table.json] [--portable] [--keep DIR]

No Intel GPU is reachable here, so the ESIMD kernels are judged by the PVC ISA that
Intel's own compilers make of them, in two steps:

1. SYCL source -> SPIR-V. The SYCL runtime's kernel compiler (the
   ``sycl_ext_oneapi_kernel_compiler`` path the sycl backend uses) builds the source
   for the OpenCL CPU device through the backend's host shim (``_Shim.build``), with
   ``SYCL_DUMP_IMAGES=1``: the runtime then writes every device image it makes,
   ``sycl_spir64*.spv``, into its working directory. That happens in a child process
   with a private working directory. The runtime splits one source into several images
   (ESIMD kernels apart from SIMT kernels, fp16 kernels apart from the rest, and one of
   its own fill kernels); an image is ESIMD when it declares ``SPV_INTEL_vector_compute``.
2. SPIR-V -> PVC ISA. ``ocloc compile -spirv_input -device pvc`` (Debian's
   ``intel-opencl-icd``), ESIMD images with ``-options -vc-codegen``, with
   ``IGC_ShaderDumpEnable=1 IGC_DumpToCustomDir=DIR``; ``DIR/*.asm`` holds one listing per
   kernel, read by ``parse_asm``.

Many kernels in ONE source make one SPIR-V module and one ocloc call: the kernels are
grouped by what must differ between builds (their source defines, their GRF mode), so a
table of configurations costs a few compiles, not one each.

The GRF mode is a build option, not part of the SPIR-V: the kernel property
``grf_size<256>`` does not reach the module, the runtime passes it to IGC as an option.
So each configuration says its GRF mode, and this compiles it with the option the
runtime will use: 256 -> ``-ze-opt-large-register-file``.

What the listing says (IGC 1.0.12504, the Debian package), and how this reads it:

- The header: ``//.kernel __sycl_kernel_<name>``, ``//.thread_config numGRF=128`` (or 256),
  ``//.instCount N`` and, only when the register allocator spilled, ``//.spill size B``;
  spill and fill messages say ``scratch space spill``/``fill`` (legacy messages) or
  ``spill to``/``fill from`` (LSC) in their comment.
- ``dpas.SxR`` (systolic depth x repeat count), e.g. ``dpas.8x8`` for
  ``xmx::dpas<8, 8, float>``.
- Memory messages come in two spellings. LSC: ``load.ugm.d32x16t.a64``,
  ``store.slm...``, ``load_block2d.ugm.d16v.a64`` (the VNNI-transformed 2-D block load of
  ``lsc_load_2d``), ``store_block2d.ugm...``; ``ugm`` is global memory, ``slm`` shared local
  memory, a ``t`` data size (``d32x16t``) a block message, any other a per-lane gather or
  scatter. Legacy dataport: ``send.dc1``/``send.dc0`` whose comment names the operation
  (``a64 dword gathering read``, ``a64 unaligned oword block read``, ``byte scattering
  write``); the descriptor's low byte 0xFE is SLM, ``a64``/0xFF global memory. The two
  loads of the kernel arguments in the thread prologs, the end-of-thread message, barriers
  and fences are not memory traffic and are counted apart (``sync``) or not at all.
- What ESIMD's memory calls compile to with this IGC (the ``gathers``/``block2d`` columns
  show which a kernel got): ``block_load``/``block_store`` of at most 128 B with a 16-B
  alignment property (``overaligned_tag<16>``) -> one legacy ``oword block`` message,
  larger or unaligned -> 16-lane dword gathers/scatters; ``slm_block_load`` -> SLM byte
  gathers (32 or 64 B a message) at any size; ``gather``/``slm_gather<uint32_t, 16 * V, V>``
  with V = 4 or 8 -> one LSC ``load.ugm.d32xV``/``load.slm.d32xV`` (16 lanes x V dwords,
  up to 512 B a message); ``lsc_load_2d``/``lsc_store_2d`` -> ``load_block2d``/
  ``store_block2d``. LSC 1-D block calls (``lsc_block_load``, ``lsc_slm_block_load``,
  ``block_load`` with cache-hint properties) stop this IGC's vISA builder ("Invalid
  execution size"): a newer driver may take them, this check cannot.

The dpas count is STATIC: the ``dpas`` instructions in the listing. A loop the compiler
keeps (a runtime loop over layers) holds its body's ``dpas`` once, however many times
it runs; an unrolled loop holds them once per iteration. So the expected count a
configuration states is the static count of its source as written (for a kernel that
loops over equal layers: the ``dpas`` of one layer body, plus the first and last layers
when they are peeled), not the dynamic count per row block; for a fully unrolled kernel
the two are the same. The check fails on a kernel whose static count differs from the
expected one, which catches both redundant matrix work and a layer left without ``dpas``.

Fails (exit 1, one line saying why) on: a missing ocloc or runtime, a compile error, a
configuration whose kernel is not in the listing, any spill, a kernel without ``dpas``,
a ``dpas`` count other than expected. ``--portable`` adds the portable SIMT kernels
(kernels/sycl/fused_mlp.cpp, compiled without ``-vc-codegen``) to the table as
information only: they never fail the check.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

GRF_OPTIONS = {128: (), 256: ("-ze-opt-large-register-file",)}
DEVICE = "pvc"
#: PVC: hardware threads a vector engine (EU) holds by GRF mode, EUs and SLM an Xe-core
THREADS_PER_EU = {128: 8, 256: 4}
EUS_PER_CORE, SLM_PER_CORE = 8, 128 * 1024
#: the runtime compiler's option that gives every kernel a SPIR-V module of its own
SPLIT_PER_KERNEL = "-fsycl-device-code-split=per_kernel"
SEND_KINDS = ("global_load", "global_store", "slm_load", "slm_store", "atomic", "spill_fill",
              "sync", "other")


class AotError(RuntimeError):
    """A tool is missing or a compile failed; the message says which and how to fix it."""


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """One kernel to compile and check.

    name: the free function's ``extern "C"`` name (the listing says ``__sycl_kernel_<name>``).
    dpas_expected: the static ``dpas`` count its listing must show (see the module's doc);
        None for an informational row that is not checked.
    instantiation: C++ appended to the common source to define the kernel (e.g. an
        ``extern "C"`` wrapper around a template instance); "" when the source has it.
    defines: ``-D`` options of the SYCL compile; kernels with other defines build apart.
    grf: 128 or 256, the GRF mode the runtime will build it in.
    esimd: whether it is an ESIMD kernel (``-vc-codegen``).
    slm_bytes, wg: the shared local memory a work-group of ``wg`` threads declares (for
        the threads a vector engine holds; the listing does not say).
    gather_share_max: the most gathers/scatters may be of its memory messages (None: not
        checked); set where every surface of the kernel allows block messages.
    inst_per_dpas_max: the most instructions a dpas its listing may hold (None: not
        checked).
    """
    name: str
    dpas_expected: int | None
    instantiation: str = ""
    defines: tuple[str, ...] = ()
    grf: int = 128
    esimd: bool = True
    slm_bytes: int = 0
    wg: int = 16
    gather_share_max: float | None = None
    inst_per_dpas_max: float | None = None

    def __post_init__(self):
        if self.grf not in GRF_OPTIONS:
            raise ValueError(f"KernelConfig {self.name}: grf={self.grf}, expected one of "
                             f"{sorted(GRF_OPTIONS)}")

    @classmethod
    def of(cls, cfg) -> "KernelConfig":
        """A KernelConfig from a backend configuration object: ``kernel_name``,
        ``dpas_per_block`` and, where it has them, ``instantiation``, ``source_defines``,
        ``grf``."""
        if isinstance(cfg, cls):
            return cfg
        return cls(name=cfg.kernel_name, dpas_expected=cfg.dpas_per_block,
                   instantiation=getattr(cfg, "instantiation", "") or "",
                   defines=tuple(getattr(cfg, "source_defines", ()) or ()),
                   grf=int(getattr(cfg, "grf", 128) or 128))


@dataclasses.dataclass
class IsaStats:
    """What one kernel's PVC listing shows."""
    kernel: str
    grf: int
    spill_bytes: int
    spill_messages: int
    inst_count: int
    dpas: int
    dpas_shapes: dict[str, int]
    sends: dict[str, int]
    gathers: int  # memory messages with per-lane addresses (not block messages)
    block2d: int  # 2-D block loads/stores


# --- the listing -----------------------------------------------------------------------
_MNEMONIC = re.compile(r"^\s*(?:\([^)]*\)\s*)?([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)*)")
_LSC = re.compile(r"^(load|store|load_block2d|store_block2d|load_cmask|store_cmask|prefetch"
                  r"|atomic_[a-z0-9]+|fence)\.(ugm|ugml|slm|tgm|scratch)\b")
_DESC = re.compile(r"\s0x[0-9A-Fa-f]+\s+0x([0-9A-Fa-f]+)\s")


def _header_int(text: str, pattern: str, default: int = 0) -> int:
    m = re.search(pattern, text, re.M)
    return int(m.group(1)) if m else default


def _send_kind(mnemonic: str, line: str) -> tuple[str, bool, bool]:
    """(kind, is a gather/scatter, is a 2-D block message) of a message instruction."""
    comment = line.split("//", 1)[1] if "//" in line else ""
    if re.search(r"\b(spill|fill)\b|scratch", comment):
        return "spill_fill", False, False
    m = _LSC.match(mnemonic)
    if m:
        op, sfid = m.groups()
        if op == "fence":
            return "sync", False, False
        space = "slm" if sfid == "slm" else "global"
        if op.startswith("atomic"):
            return "atomic", True, False
        block2d = "block2d" in op
        gather = not block2d and not re.search(r"\.d\d+x\d+t\b|\.d\d+t\b", mnemonic)
        return f"{space}_{'load' if op.startswith(('load', 'prefetch')) else 'store'}", \
            gather, block2d
    # legacy dataport / gateway: the comment after "rd:N;" names the operation
    if ".gtwy" in mnemonic or "barrier" in comment or "fence" in comment:
        return "sync", False, False
    what = comment.split(";", 1)[1] if ";" in comment else comment
    d = _DESC.search(line)
    slm = (d is not None and d.group(1).lower().endswith("fe")) or ".slm" in mnemonic
    space = "slm" if slm else "global"
    gather = "gathering" in what or "scattering" in what
    if "atomic" in what:
        return "atomic", True, False
    if "read" in what:
        return f"{space}_load", gather, False
    if "write" in what:
        return f"{space}_store", gather, False
    return "other", False, False


def parse_asm(text: str) -> IsaStats:
    """Read one kernel's IGC listing (``DIR/*.asm``) into IsaStats."""
    name = re.search(r"^//\.kernel\s+(\S+)", text, re.M)
    kernel = name.group(1) if name else "?"
    kernel = kernel[len("__sycl_kernel_"):] if kernel.startswith("__sycl_kernel_") else kernel
    sends: Counter = Counter({k: 0 for k in SEND_KINDS})
    shapes: Counter = Counter()
    gathers = block2d = spill_msgs = 0
    prolog = False
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("//"):
            if "_prolog" in s:  # the payload loads of the kernel arguments
                prolog = True
            elif re.match(r"//\s*B\d+", s) or s.startswith("// __sycl_kernel"):
                prolog = False
            continue
        if s.endswith(":") and "prolog" in s:
            prolog = True
            continue
        m = _MNEMONIC.match(line)
        if not m:
            continue
        mn = m.group(1)
        if mn.startswith("dpas"):
            shapes[mn.split(".", 1)[1] if "." in mn else mn] += 1
            continue
        is_send = mn.split(".")[0] in ("send", "sendc", "sends", "sendsc") or _LSC.match(mn)
        if not is_send or prolog or "EOT" in line:
            continue
        kind, gather, b2d = _send_kind(mn, line)
        sends[kind] += 1
        spill_msgs += kind == "spill_fill"
        gathers += gather
        block2d += b2d
    return IsaStats(
        kernel=kernel, grf=_header_int(text, r"numGRF=(\d+)"),
        spill_bytes=_header_int(text, r"^//\.spill size (\d+)"), spill_messages=spill_msgs,
        inst_count=_header_int(text, r"^//\.instCount (\d+)"), dpas=sum(shapes.values()),
        dpas_shapes=dict(sorted(shapes.items())), sends=dict(sends), gathers=gathers,
        block2d=block2d)


# --- the tools -------------------------------------------------------------------------
def find_ocloc() -> str:
    """ocloc's path ($OCLOC or PATH); AotError naming the package when it is missing."""
    path = shutil.which(os.environ.get("OCLOC", "ocloc"))
    if path is None:
        raise AotError("ocloc not found (install Debian's intel-opencl-icd: "
                       "apt-get install intel-opencl-icd; or set OCLOC)")
    return path


_WORKER = """
import sys
from pathlib import Path
from fusedmlp_xpu.backends import sycl
src = Path(sys.argv[1]).read_bytes()
inc = {Path(p).name: Path(p).read_bytes() for p in sys.argv[3:]}
opts = [o for o in Path(sys.argv[2]).read_text().split("\\n") if o]
sycl.shim().build(sycl.cpu_queue().addressof_ref(), src, [], includes=inc, options=opts)
"""


def build_spirv(source: str, includes: dict[str, str | bytes], options: list[str],
                workdir: Path) -> list[Path]:
    """SYCL source -> its SPIR-V images (``workdir/sycl_spir64*.spv``), built by the sycl
    backend's runtime compiler on opencl:cpu in a child process (SYCL_DUMP_IMAGES)."""
    workdir.mkdir(parents=True, exist_ok=True)
    inc_dir = workdir / "include"
    inc_dir.mkdir(exist_ok=True)
    for n, text in includes.items():
        (inc_dir / n).write_bytes(text.encode() if isinstance(text, str) else text)
    (workdir / "kernels.cpp").write_text(source)
    (workdir / "options.txt").write_text("\n".join(options))
    env = dict(os.environ, SYCL_DUMP_IMAGES="1",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1])]
                                          + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    # only the OpenCL CPU runtime: Debian's intel-opencl-icd also registers its GPU
    # runtime in /etc/OpenCL/vendors, which has no device here
    vendors = workdir / "no_vendors"
    vendors.mkdir(exist_ok=True)
    env["OCL_ICD_VENDORS"] = str(vendors)
    if "OCL_ICD_FILENAMES" not in env:
        from fusedmlp_xpu.backends import sycl
        icd = sycl._dist_file("intel-opencl-rt", "lib/libintelocl.so")
        if icd is not None:
            env["OCL_ICD_FILENAMES"] = str(icd)
    r = subprocess.run([sys.executable, "-c", _WORKER, "kernels.cpp", "options.txt"]
                       + [str(inc_dir / n) for n in includes], cwd=workdir, env=env,
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise AotError(f"SYCL -> SPIR-V failed (options {options}):\n{r.stderr[-6000:]}")
    images = sorted(workdir.glob("sycl_spir64*.spv"))
    if not images:
        raise AotError("SYCL -> SPIR-V: the runtime wrote no sycl_spir64*.spv "
                       "(SYCL_DUMP_IMAGES unsupported by this intel-sycl-rt?)")
    return images


def visa_errors(dump_dir: Path) -> str:
    """The vISA verifier's findings that IGC writes beside a failed kernel
    (``*.errors.txt``; ocloc itself only says "VISA builder API call failed"): one line
    per kernel and message, with the first offending instruction."""
    seen: dict[tuple[str, str], str] = {}
    for f in sorted(dump_dir.glob("*.errors.txt")):
        text = f.read_text(errors="replace")
        for m in re.finditer(r"routine with name:\s*(\S+)\s+Error Message:\s*([^\n]+)"
                             r"(?:.*?Violating Instruction:\s*([^\n]+))?", text, re.S):
            key = (m.group(1).removeprefix("__sycl_kernel_"), m.group(2).strip())
            seen.setdefault(key, " ".join((m.group(3) or "").split()))
    return "".join(f"\n  {k}: {msg} (e.g. {ins})" for (k, msg), ins in seen.items())


def compile_pvc(spirv: Path, esimd: bool, grf: int, dump_dir: Path) -> dict[str, str]:
    """SPIR-V -> PVC ISA with ocloc; {kernel name: its listing}."""
    ocloc = find_ocloc()
    dump_dir.mkdir(parents=True, exist_ok=True)
    opts = list(GRF_OPTIONS[grf])
    if esimd:
        opts.insert(0, "-vc-codegen")
    cmd = [ocloc, "compile", "-spirv_input", "-file", str(spirv), "-device", DEVICE,
           "-output_no_suffix", "-output", "bin", "-out_dir", str(dump_dir)]
    if opts:
        cmd += ["-options", " ".join(opts)]
    env = dict(os.environ, IGC_ShaderDumpEnable="1", IGC_DumpToCustomDir=str(dump_dir))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0 or "Build succeeded" not in r.stdout + r.stderr:
        raise AotError(f"ocloc failed on {spirv.name} ({' '.join(cmd[1:])}):\n"
                       f"{(r.stdout + r.stderr)[-3000:]}{visa_errors(dump_dir)}")
    out = {}
    for asm in sorted(dump_dir.glob("*.asm")):
        text = asm.read_text(errors="replace")
        out[parse_asm(text).kernel] = text
    return out


# --- the table -------------------------------------------------------------------------
def _batches(configs, jobs: int):
    """(defines, grf, esimd, configs) of each SPIR-V build and ocloc call: configurations
    that can share one, split ``jobs`` ways where each brings its own instantiation."""
    groups: dict[tuple, list[KernelConfig]] = {}
    for c in configs:
        groups.setdefault((c.defines, c.grf, c.esimd), []).append(c)
    for key, group in groups.items():
        n = max(1, min(jobs, len(group))) if all(c.instantiation for c in group) else 1
        for k in range(n):
            yield (*key, group[k::n])


def _compile_batch(batch, source: str, includes, workdir: Path, options
                   ) -> list[tuple[KernelConfig, dict]]:
    defines, grf, esimd, group = batch
    text = source + "".join("\n" + c.instantiation for c in group if c.instantiation)
    images = build_spirv(text, includes, list(options) + [f"-D{x}" for x in defines], workdir)
    ours = [img for img in images if any(
        f"__sycl_kernel_{c.name}\0".encode() in img.read_bytes() for c in group)]
    if not ours:  # the runtime's own kernels only
        raise AotError(f"no SPIR-V image of the build holds {group[0].name} or the other "
                       f"{len(group) - 1} kernels of its group (a kernel property the "
                       "OpenCL CPU device lacks, such as grf_size, keeps an image from it: "
                       "build without it and give the GRF mode as KernelConfig.grf)")
    listings: dict[str, str] = {}
    for j, img in enumerate(ours):
        is_esimd = b"SPV_INTEL_vector_compute" in img.read_bytes()
        listings.update(compile_pvc(img, is_esimd, grf, workdir / f"isa{j}"))
    rows = []
    for c in group:
        if c.name not in listings:
            raise AotError(f"kernel {c.name}: not in the PVC listings of its build "
                           f"(found {sorted(listings)})")
        row = dataclasses.asdict(parse_asm(listings[c.name]))
        row.update(kernel=c.name, dpas_expected=c.dpas_expected, esimd=esimd, options=" ".join(
            (["-vc-codegen"] if esimd else []) + list(GRF_OPTIONS[grf])
            + [f"-D{x}" for x in defines]),
            alone=SPLIT_PER_KERNEL in options,
            threads_per_eu=threads_per_eu(row["grf"] or grf, c.slm_bytes, c.wg),
            inst_per_dpas=round(row["inst_count"] / row["dpas"], 2) if row["dpas"] else None,
            gather_share_max=c.gather_share_max, inst_per_dpas_max=c.inst_per_dpas_max)
        rows.append((c, row))
    return rows


def isa_table(configs, source: str, includes: dict[str, str | bytes], workdir: Path,
              options: list[str] = (), jobs: int = 1, errors: list[str] | None = None
              ) -> list[dict]:
    """Compile ``configs`` (KernelConfig, or backend objects KernelConfig.of reads) for PVC:
    one row per configuration, the IsaStats fields plus ``dpas_expected``, ``esimd`` and
    ``options``, in the order given. ``jobs`` builds run at once (ocloc takes ~2 s of one
    core per ESIMD kernel of a few thousand instructions). A build that fails (or a kernel
    missing from its listings) raises AotError, or, with ``errors`` given, adds its message
    there and leaves its kernels out of the table."""
    configs = [KernelConfig.of(c) for c in configs]
    keys = [(c.name, c.defines, c.grf) for c in configs]
    dup = {k[0] for k in keys if keys.count(k) > 1}
    if dup:
        raise ValueError(f"configs: kernels repeated with the same defines and GRF mode: "
                         f"{sorted(dup)}")
    batches = list(_batches(configs, jobs))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(_compile_batch, b, source, includes, workdir / f"build{i}",
                               options) for i, b in enumerate(batches)]
        rows = []
        for f in futures:
            try:
                rows += f.result()
            except AotError as e:
                if errors is None:
                    raise
                errors.append(str(e))
    order = {k: i for i, k in enumerate(keys)}
    return [r for c, r in sorted(rows, key=lambda cr: order[(cr[0].name, cr[0].defines,
                                                              cr[0].grf)])]


def threads_per_eu(grf: int, slm_bytes: int, wg: int) -> int:
    """Hardware threads a vector engine holds: the GRF mode's limit, or fewer where the
    work-groups' SLM fills the Xe-core first."""
    by_grf = THREADS_PER_EU[grf]
    if slm_bytes <= 0:
        return by_grf
    return min(by_grf, (SLM_PER_CORE // slm_bytes) * wg // EUS_PER_CORE)


def memory_messages(r: dict) -> int:
    s = r["sends"]
    return sum(s[k] for k in ("global_load", "global_store", "slm_load", "slm_store", "atomic"))


def failures(rows) -> list[str]:
    """Why the checked rows fail (dpas_expected not None): spills, no dpas, a dpas count
    other than expected, a GRF mode other than asked, more gathers or instructions a dpas
    than the configuration allows; empty when all pass."""
    out = []
    for r in rows:
        if r["dpas_expected"] is None:
            continue
        k = r["kernel"]
        share = r.get("gather_share_max")
        msgs = memory_messages(r) if "sends" in r else 0
        if share is not None and r["gathers"] > share * msgs:
            out.append(f"{k}: {r['gathers']} of its {msgs} memory messages are gathers/"
                       f"scatters, more than {share:.0%} (its aligned I/O went back to "
                       "per-lane messages?)")
        ipd = r.get("inst_per_dpas_max")
        if ipd is not None and r["dpas"] and r["inst_count"] / r["dpas"] > ipd:
            out.append(f"{k}: {r['inst_count'] / r['dpas']:.1f} instructions a dpas, "
                       f"target {ipd}")
        if r["spill_bytes"] or r["spill_messages"]:
            out.append(f"{k}: spills {r['spill_bytes']} B ({r['spill_messages']} spill/fill "
                       f"messages) at {r['grf']} GRF")
        if r["dpas"] == 0:
            out.append(f"{k}: no dpas instruction in its PVC listing")
        elif r["dpas"] != r["dpas_expected"]:
            out.append(f"{k}: {r['dpas']} dpas in its PVC listing, expected "
                       f"{r['dpas_expected']} (static count, see ci/aot_sycl.py)")
        want = 256 if "-ze-opt-large-register-file" in r["options"] else 128
        if r["grf"] != want:
            out.append(f"{k}: compiled at {r['grf']} GRF, asked for {want}")
    return out


def format_row(r: dict) -> str:
    s = r["sends"]
    shapes = ",".join(f"{k}:{v}" for k, v in r["dpas_shapes"].items()) or "-"
    exp = "" if r["dpas_expected"] is None else f"/{r['dpas_expected']}"
    ipd = f"{r['inst_count'] / r['dpas']:5.1f}/dpas" if r["dpas"] else "    -/dpas"
    return (f"{r['kernel']:<44} {r['grf']:>3} GRF {r.get('threads_per_eu', '?')} thr/EU "
            f"{r['spill_bytes']:>5} B spill dpas {r['dpas']:>3}{exp:<4} ({shapes}) "
            f"ld/st global {s['global_load']}/{s['global_store']} "
            f"slm {s['slm_load']}/{s['slm_store']} gathers {r['gathers']} "
            f"2d {r['block2d']} {r['inst_count']:>5} inst {ipd}")


def environment(workdir: Path) -> dict:
    """What made the table: ocloc's driver version, the SYCL runtime, the commit, the date."""
    import datetime
    import importlib.metadata as md

    q = workdir / "query"
    q.mkdir(parents=True, exist_ok=True)
    subprocess.run([find_ocloc(), "query", "OCL_DRIVER_VERSION"], cwd=q, capture_output=True)
    ver = q / "OCL_DRIVER_VERSION"
    try:
        rt = md.version("intel-sycl-rt")
    except md.PackageNotFoundError:
        rt = None
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                         capture_output=True, text=True)
    driver = ver.read_text().strip("\x00 \n") if ver.exists() else None
    return {"machine": "pvc", "device": DEVICE, "ocloc_driver": driver, "intel_sycl_rt": rt,
            "commit": git.stdout.strip() or None,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


# --- the configurations ----------------------------------------------------------------
#: issue 61's listing targets (256 GRF), instructions a dpas at most, by kernel name: the
#: forward below Intel's own tiny-dpcpp-nn inference kernel put through this pipeline
#: (12.3 at bf16 64/64/64, 5.9 at fp16 128/128/128)
INST_PER_DPAS_TARGETS = {
    "fmlp_esimd_fwd_bf16_64_64_64_a1_0_io7": 12,
    "fmlp_esimd_bwd_bf16_64_64_64_a1_0_io7": 16,
    "fmlp_esimd_fwd_f16_128_128_128_a1_0_io7": 8,
    # every layer's weight gradients, x and z/dz by 2-D block messages (run
    # pvc-isa-20261205c: 32.2 bf16, 33.7 f16; 533.5 before, gathering one dz column a lane)
    "fmlp_esimd_wgrad_bf16_a1_io5": 40,
    "fmlp_esimd_wgrad_f16_a1_io5": 40,
}
#: gathers/scatters at most, as a share of memory messages, where every surface of the
#: kernel allows 2-D block messages: forward and backward (_io7), weight gradients (_io5)
GATHER_SHARE_MAX = {"rows": 0.10, "wgrad": 0.25}


def esimd_configs(match: str = ""):
    """(configs, source, includes, options) of the sycl backend's ESIMD kernels
    (fusedmlp_xpu.backends.sycl_esimd): every configuration the dispatcher can pick
    (``all_configs()``), its forward and backward kernels and the weight-gradient kernels
    they use (one a dtype and I/O mode), with the static dpas count the configuration states (``cfg.dpas(kind)``), each
    with its own instantiation (``cfg.instantiation((kind,))``) so that builds can split,
    built with the backend's device options (``build_options(False)``). Of those,
    ``-DFMLP_ESIMD_LARGE_GRF`` gives the kernels the ``grf_size<256>`` property, which
    keeps their image from the CPU device: the source is built without it and ocloc gets
    the mode instead. ``match``: only the kernels whose name contains it."""
    from fusedmlp_xpu.backends import sycl_esimd as se

    large = "-DFMLP_ESIMD_LARGE_GRF"
    options = [o for o in se.build_options(False) if o != large]
    grf = 256 if large in se.build_options(False) else 128
    full_io = se.IO_X | se.IO_Y | se.IO_Z
    configs, seen = [], set()
    for cfg in se.all_configs():
        for k in ("fwd", "bwd", "wgrad"):
            name = cfg.kernel(k)
            if match in name and name not in seen:
                seen.add(name)
                blocks = (cfg.io & (se.IO_X | se.IO_Z)) == (se.IO_X | se.IO_Z) \
                    if k == "wgrad" else cfg.io == full_io
                share = GATHER_SHARE_MAX["wgrad" if k == "wgrad" else "rows"] if blocks else None
                configs.append(KernelConfig(
                    name, cfg.dpas(k), cfg.instantiation((k,)), grf=grf,
                    slm_bytes=se.slm_bytes(k), wg=se.WG, gather_share_max=share,
                    inst_per_dpas_max=INST_PER_DPAS_TARGETS.get(name)))
    if not configs:
        raise ValueError(f"--match {match!r}: no ESIMD kernel name contains it")
    return configs, se.source([]).decode(), se.includes(), options


def portable_configs():
    """The portable SIMT kernels (kernels/sycl/fused_mlp.cpp), unchecked rows."""
    from fusedmlp_xpu.backends import sycl

    names = [f"fmlp_{k}_{t}" for k in ("fwd", "bwd_rows", "wgrad") for t in ("f32", "f16", "bf16")]
    configs = [KernelConfig(n, None, esimd=False) for n in names]
    return configs, sycl.KERNEL_SOURCE.read_text(), {
        sycl.PARAMS_HEADER.name: sycl.PARAMS_HEADER.read_bytes()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="write the table as JSON here")
    p.add_argument("--portable", action="store_true",
                   help="add the portable SIMT kernels (information, not checked)")
    p.add_argument("--keep", type=Path, help="keep SPIR-V and listings in this directory")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="builds at once (default: the CPU count)")
    p.add_argument("--match", default="", help="only the ESIMD kernels whose name contains "
                   "this (e.g. fwd_bf16)")
    p.add_argument("--alone", action="store_true",
                   help="every kernel in a SPIR-V module of its own (as the runtime builds "
                   "it: one kernel a module), not grouped into a few")
    args = p.parse_args(argv)
    try:
        ocloc = find_ocloc()
    except AotError as e:
        print(f"FAILED: {e}")
        return 1
    work = args.keep or Path(tempfile.mkdtemp(prefix="aot_sycl-"))
    try:
        try:
            configs, source, includes, options = esimd_configs(args.match)
        except (ImportError, AttributeError, ValueError) as e:
            print(f"the ESIMD kernel configurations: {e}")
            return 1
        print(f"{ocloc}, -device {DEVICE}: {len(configs)} ESIMD kernels")
        errors: list[str] = []
        if args.alone:
            options = list(options) + [SPLIT_PER_KERNEL]
        rows = isa_table(configs, source, includes, work / "esimd", options, args.jobs, errors)
        if args.portable:
            pc, psrc, pinc = portable_configs()
            rows += isa_table(pc, psrc, pinc, work / "portable", errors=errors)
        env = environment(work)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    for r in rows:
        print(format_row(r))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        # a run of the pvc results table: python -m fusedmlp_xpu.bench.results add OUT
        table = {"schema": "fusedmlp-pvc-isa/1", "environment": env, "kernels": rows}
        args.out.write_text(json.dumps(table, indent=1) + "\n")
    bad = errors + failures(rows)
    for b in bad:
        print(f"FAILED: {b}")
    return 1 if bad or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
