"""The robustness campaign: fuzzing and fault injection, time-boxed and seeded.

    python -m fuzz.campaign [--quick] [--seed N] [--out build/fuzz.json]

1. Coverage-guided fuzzing (atheris/libFuzzer) of the fast reader + verifier, seeded
   from the fixture corpus, with an RSS cap and a per-input timeout.
2. The C++ `smoe-stream check` under ASan/UBSan on seeded mutations of the fixtures
   (the harness's own mutation runner).
3. SIGKILL of `smoe sculpt` at random instants, each followed by `--resume`; the result
   must be byte-identical to an uninterrupted run, and no partial file may ever appear
   under the final name.
4. SIGKILL of `smoe upgrade` before each of its writes/fsyncs and at random instants;
   the file must always verify as a valid v1 or v2 vault with unchanged blobs.
5. Structure-aware mutations of the safetensors shard headers of the bundled checkpoints,
   judged against the `safetensors` library (fuzz/st_target.py).
6. Mutations of their config.json, each with the verdict it must get (fuzz/config_target.py).
7. Structure-aware mutations of the sidecars (manifest, resume journal, importance matrix),
   each read by the commands that read it in a child process under a memory cap and a time
   limit (fuzz/sidecar_target.py).

Failing cases of 5, 6 and 7 are saved under build/fuzz/<target>/ with a replay command.

Counts go to build/fuzz.json; any failure makes the exit status 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SMOE = [sys.executable, "-m", "smoe"]


def fuzz_python(runs: int, seconds: int, seed: int, work: Path, quick: bool = False) -> dict:
    if importlib.util.find_spec("atheris") is None:
        # atheris (the `fuzz` extra) has no wheel for every platform: the short campaign of
        # `make test` names the missing dependency and goes on; `make fuzz` fails without it
        return {
            "ok": quick,
            "skipped": "atheris is not installed (pip install -e '.[fuzz]'; "
            "it has no wheel for this platform)",
        }
    corpus = work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for p in [*FIXTURES.glob("*.smoe"), *(FIXTURES / "corrupt").glob("*.smoe")]:
        shutil.copy(p, corpus / p.name)
    artifacts = work / "crashes"
    artifacts.mkdir(exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "fuzz.reader_target",
        str(corpus),
        f"-runs={runs}",
        f"-max_total_time={seconds}",
        f"-seed={seed}",
        # RSS grows ~40 KB per input under atheris (flat without it); one allocation of
        # over 2 GB is still a crash
        "-rss_limit_mb=6144",
        "-malloc_limit_mb=2048",
        "-timeout=20",
        "-max_len=200000",
        f"-artifact_prefix={artifacts}/",
        "-print_final_stats=1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    m = re.findall(r"stat::number_of_executed_units:\s+(\d+)", proc.stderr)
    cov = re.findall(r"cov: (\d+)", proc.stderr)
    crashes = sorted(p.name for p in artifacts.iterdir())
    return {
        "inputs": int(m[-1]) if m else 0,
        "coverage_edges": int(cov[-1]) if cov else 0,
        "crashes": crashes,
        "exit_code": proc.returncode,
        "ok": proc.returncode == 0 and not crashes,
        "log_tail": proc.stderr[-1500:] if proc.returncode else "",
    }


def fuzz_cpp(mutations: int, seed: int, work: Path) -> dict:
    binary = ROOT / "build" / "asan" / "smoe-stream"
    if not binary.exists():
        subprocess.run(["make", "-s", "build-asan"], cwd=ROOT, check=True)
    seeds = sorted(str(p) for p in FIXTURES.glob("*.smoe"))
    crashes = work / "crashes"
    crashes.mkdir(parents=True, exist_ok=True)
    cmd = [str(binary), "fuzz", str(seed), str(mutations), "--save", str(crashes), *seeds]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {"raw": proc.stdout[-500:]}
    sanitizer = "runtime error" in proc.stderr or "AddressSanitizer" in proc.stderr
    info.update(
        exit_code=proc.returncode,
        sanitizer_reports=sanitizer,
        ok=proc.returncode == 0 and not sanitizer and info.get("failed", 1) == 0,
    )
    if not info["ok"]:
        info["log_tail"] = proc.stderr[-1500:]
    return info


def kill_sculpt(kills: int, seed: int, work: Path) -> dict:
    """Kill `smoe sculpt --resume` at random instants; always finish byte-identical."""
    from smoe.sculpt import SculptOptions, SculptResult, sculpt
    from smoe_testkit.synth import write_checkpoint

    rng = random.Random(seed)
    layers, experts = 4, 32
    ck = write_checkpoint(
        work / "ckpt" / "killme", layers=layers, experts=experts, d_model=512, ffn=256, seed=seed
    )
    # not a dry run: sculpt returns a SculptResult
    ref = cast(SculptResult, sculpt(ck, work / "ref", SculptOptions()))
    ref_vault, ref_scout = ref.vault.read_bytes(), ref.scout.read_bytes()
    t = time.perf_counter()
    subprocess.run(
        [*SMOE, "sculpt", str(ck), str(work / "timing")], check=True, capture_output=True
    )
    full = time.perf_counter() - t
    out = work / "out"
    survived, partial_seen, attempts = 0, 0, 0
    stages = {"before_first_expert": 0, "mid_experts": 0, "after_experts": 0}
    failures = []
    interrupted = 0
    while interrupted < kills and attempts < 3 * kills:  # count only runs really cut short
        attempts += 1
        if out.exists():
            shutil.rmtree(out)
        proc = subprocess.Popen(
            [*SMOE, "sculpt", str(ck), str(out), "--resume"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0, full * 0.9))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.returncode == 0:
            continue  # finished before the kill: not an interruption
        interrupted += 1
        journal = out / ".killme.smoe.journal"
        final = out / "killme.smoe"
        lines = journal.read_text().count("\n") - 1 if journal.exists() else -1
        if lines <= 0:
            stages["before_first_expert"] += 1
        elif lines < layers * experts:
            stages["mid_experts"] += 1
        else:
            stages["after_experts"] += 1
        if final.exists() and final.read_bytes() != ref_vault:  # complete is fine, partial not
            partial_seen += 1
            failures.append(f"kill {interrupted}: a partial vault appeared under the final name")
        done = subprocess.run(  # --force: a kill after the commit left the vault complete
            [*SMOE, "sculpt", str(ck), str(out), "--resume", "--force"],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            failures.append(f"kill {interrupted}: resume failed: {done.stderr[-300:]}")
            continue
        if (
            final.read_bytes() != ref_vault
            or (out / "killme.scout.safetensors").read_bytes() != ref_scout
        ):
            failures.append(f"kill {interrupted}: resumed vault differs from the clean run")
            continue
        survived += 1
    return {
        "kills": interrupted,
        "attempts": attempts,
        "survived": survived,
        "stages": stages,
        "partial_under_final_name": partial_seen,
        "failures": failures[:10],
        "ok": survived == interrupted >= kills,
    }


PAUSE = """
import sys
from smoe.format.records import ArchInfo
from smoe.vault.upgrade import OsOps, upgrade
class Pause(OsOps):
    def _pause(self):
        print("step", flush=True); sys.stdin.readline()
    def pwrite(self, fd, data, offset):
        self._pause(); return super().pwrite(fd, data, offset)
    def fsync(self, fd):
        self._pause(); super().fsync(fd)
arch = ArchInfo(rope_theta=1e4, num_heads=4, num_kv_heads=4, head_dim=16, moe_top_k=2,
                moe_ffn_dim=32, num_hidden_layers=2, rms_norm_eps=1e-6, model_type="olmoe")
upgrade(sys.argv[1], arch, ops=Pause() if sys.argv[2] == "pause" else None)
"""


def kill_upgrade(random_kills: int, seed: int, work: Path) -> dict:
    """Kill `upgrade` before each write/fsync, then at random instants: always valid."""
    from smoe.format.verify import verify
    from smoe.vault.reader import Vault

    rng = random.Random(seed)
    src = FIXTURES / "q4_v1.smoe"
    blobs = src.read_bytes()[Vault.open(src).geometry.data_offset :]
    versions: dict[int, int] = {1: 0, 2: 0}
    failures = []
    trials = 0
    for mode, count in (("pause", 6), ("random", random_kills)):
        for i in range(count):
            p = work / f"u{mode}{i}.smoe"
            p.write_bytes(src.read_bytes())
            proc = subprocess.Popen(
                [sys.executable, "-c", PAUSE, str(p), mode],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proc.stdout is not None and proc.stdin is not None  # both PIPE
            if mode == "pause":
                for _ in range(i):
                    proc.stdout.readline()
                    proc.stdin.write("\n")
                    proc.stdin.flush()
                proc.stdout.readline()
            else:
                time.sleep(rng.uniform(0.0, 0.6))
            proc.kill()
            proc.wait()
            trials += 1
            report = verify(np.fromfile(p, np.uint8), deep=True)
            if report.errors:
                failures.append(f"{mode} {i}: {report.errors[0].line()}")
                continue
            v = Vault.open(p)
            versions[v.geometry.version] += 1
            if p.read_bytes()[v.geometry.data_offset :] != blobs:
                failures.append(f"{mode} {i}: blobs changed")
            p.unlink()
    return {
        "kills": trials,
        "valid_v1": versions[1],
        "valid_v2": versions[2],
        "failures": failures[:10],
        "ok": not failures,
    }


def fuzz_inputs(target: str, cases: int, seconds: float, cli_every: int, seed: int) -> dict:
    """Seeded input mutations (fuzz/inputs_target.py): ``cases`` cases, fewer if ``seconds``
    run out first; reproducers of failures in build/fuzz/<target>/.

    Works in RAM when it can (/dev/shm): every accepted case fsyncs a vault and a scout.
    """
    from fuzz.inputs_target import run, scratch

    with tempfile.TemporaryDirectory(prefix=f"smoe-fuzz-{target}-", dir=scratch()) as tmp:
        return run(target, cases, seconds, seed, Path(tmp), cli_every=cli_every)


def fuzz_sidecars(cases: int, seconds: float, fresh_every: int, seed: int) -> dict:
    """Seeded sidecar mutations (fuzz/sidecar_target.py): ``cases`` cases, fewer if
    ``seconds`` run out first; every ``fresh_every``-th case in new interpreters (0: none);
    reproducers of failures in build/fuzz/sidecar/."""
    from fuzz.sidecar_target import run, scratch

    with tempfile.TemporaryDirectory(prefix="smoe-fuzz-sidecar-", dir=scratch()) as tmp:
        return run(cases, seconds, seed, Path(tmp), fresh_every=fresh_every)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a short run (used by make test)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "fuzz.json")
    args = ap.parse_args()
    q = args.quick
    results = {}
    with tempfile.TemporaryDirectory(prefix="smoe-fuzz-") as tmp:
        work = Path(tmp)
        steps = [
            (
                "python_reader_fuzz",
                lambda d: fuzz_python(3000 if q else 10**9, 30 if q else 240, args.seed, d, q),
            ),
            ("cpp_check_mutations", lambda d: fuzz_cpp(2000 if q else 50000, args.seed, d)),
            ("sculpt_kills", lambda d: kill_sculpt(4 if q else 60, args.seed, d)),
            ("upgrade_kills", lambda d: kill_upgrade(4 if q else 50, args.seed, d)),
            # quick: a fixed number of cases (the same ones on every machine), time-capped
            (
                "safetensors_header_mutations",
                lambda d: fuzz_inputs(
                    "safetensors",
                    250 if q else 10**9,
                    10 if q else 240,
                    100 if q else 50,
                    args.seed,
                ),
            ),
            (
                "config_mutations",
                lambda d: fuzz_inputs(
                    "config", 350 if q else 10**9, 8 if q else 180, 100 if q else 50, args.seed
                ),
            ),
            (
                "sidecar_mutations",
                lambda d: fuzz_sidecars(
                    30 if q else 10**9, 6 if q else 180, 0 if q else 50, args.seed
                ),
            ),
        ]
        for name, step in steps:
            (work / name).mkdir(exist_ok=True)
            t = time.perf_counter()
            results[name] = step(work / name)
            results[name]["seconds"] = round(time.perf_counter() - t, 1)
            verdict = "ok" if results[name]["ok"] else "FAILED"
            print(f"fuzz: {name}: {verdict} {json.dumps(results[name])[:400]}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results["quick"] = q
    results["seed"] = args.seed
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    ok = all(r["ok"] for r in results.values() if isinstance(r, dict))
    print(f"fuzz: {'all ok' if ok else 'FAILURES'}; wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
