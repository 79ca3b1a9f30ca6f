"""The ``rlkernel`` command: ``info``, ``conformance``, ``accuracy``, ``bench`` and ``validate``.

The CLI parses arguments, calls the library and prints; the work is done in
:mod:`rlkernel.conformance.runner`, :mod:`rlkernel.conformance.report`, :mod:`rlkernel.bench` and
:mod:`rlkernel.validate`.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import torch

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _cuda_arch(index: int) -> str:
    # when using hip devices, the device type in pytorch is "cuda": name the gfx target instead
    if getattr(torch.version, "hip", None):
        return str(getattr(torch.cuda.get_device_properties(index), "gcnArchName", "gfx?"))
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def _served_by(device: torch.device) -> str:
    """`` -> rocm (gfx942: compiled)``: the backend that runs ops on ``device`` by default, and its level there."""
    from rlkernel.registry import backend_for

    try:
        backend = backend_for(device.type)
        return f" -> {backend.name} ({backend.architecture(device)}: {backend.level(device)})"
    except RuntimeError as exc:  # no usable backend serves it: say why, do not fail the listing
        return f" -> no backend ({exc})"


def cmd_info(args: argparse.Namespace) -> int:
    """Print versions, devices, backends (probe, devices, levels, kernel count) and contracts."""
    import platform

    from rlkernel import __version__
    from rlkernel.environment import cpu_model, package_version

    print(f"rlkernel {__version__}  torch {torch.__version__}  triton {package_version('triton')}  "
          f"python {platform.python_version()}")
    print("devices:")
    print(f"  cpu: {cpu_model()} ({platform.machine()})")
    if torch.cuda.is_available():  # CUDA (or ROCm presenting itself as cuda) only; no other vendor is touched
        for i in range(torch.cuda.device_count()):
            print(f"  cuda:{i}: {torch.cuda.get_device_name(i)} ({_cuda_arch(i)}){_served_by(torch.device('cuda', i))}")
            if torch.version.hip is None and torch.cuda.get_device_capability(i) == (9, 0):
                from rlkernel.backends.cuda import digit_gemm

                on = digit_gemm.usable(torch.device("cuda", i), 1024)
                print(f"    linear prefill digit GEMM: {'sm_90 wgmma (CUDA C, NVRTC)' if on else 'Triton'} "
                      f"({digit_gemm.ENV}={'1' if on else '0'}; the same integers either way)"
                      + (f"; rows 65-256 too from N = {digit_gemm.MID_MIN_N}" if on else ""))
    print("backends:")
    try:
        from rlkernel.registry import all_backends, probe_results

        backends = all_backends()
        probes = probe_results()
    except Exception as exc:  # a broken built-in is shown, and the exit status says so
        print(f"  failed to load the backends: {type(exc).__name__}: {exc}")
        backends, probes, status = {}, {}, EXIT_FAILED
    else:
        status = EXIT_OK
    for name, backend in backends.items():
        ok, reason = probes.get(name, (False, "not probed"))
        levels = ", ".join(f"{arch}={level}" for arch, level in backend.verification.items()) or "unverified"
        print(f"  {name:<10} {'usable' if ok else 'unusable':<9} devices={','.join(backend.device_types)}  "
              f"kernels={len(backend.kernels)}  levels: {levels}  ({reason})")
    for name, (ok, reason) in probes.items():
        if name not in backends:
            print(f"  {name:<10} {'usable' if ok else 'unusable':<9} ({reason})")
    if backends:
        _print_dispatch()
    print("contracts:")
    from rlkernel.contracts import load_contracts

    broken: dict[str, BaseException] = {}
    modules, missing = load_contracts(errors=broken)
    for name, module in modules.items():
        contract = module.CONTRACT
        print(f"  {name:<17} v{contract.version}  {contract.summary}")
    for name, error in broken.items():
        print(f"  {name:<17} FAILED to import: {type(error).__name__}: {error}")
    for name in missing:
        print(f"  {name:<17} (not present)")
    return EXIT_FAILED if broken else status


def _print_dispatch() -> None:
    """Per device type, which backend runs which op by default (per-op selection, registry)."""
    import textwrap

    from rlkernel.registry import serving_table

    print("dispatch (per op: the usable backend with the lowest priority that has it; a forced backend runs "
          "every op or raises):")
    for device_type, ops in serving_table().items():
        print(f"  {device_type}:")
        by_backend: dict[str, list[str]] = {}
        for op, name in ops.items():
            by_backend.setdefault(name, []).append(op)
        for name, names in by_backend.items():
            text = textwrap.fill(", ".join(names), width=100, initial_indent=" " * 4 + f"{name:<10} ",
                                 subsequent_indent=" " * 15)
            print(text)


def _sigterm_interrupts() -> None:
    """Deliver SIGTERM as ``KeyboardInterrupt`` so a long run can stop cleanly and report."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def _part_args(args: argparse.Namespace) -> list[str]:
    """The ``rlkernel conformance`` arguments each ``--jobs`` part repeats (its ops and --out are its own)."""
    out = ["--full" if args.full else "--quick"]
    for flag, value in (("--backend", args.backend), ("--device", args.device), ("--manifest", args.manifest)):
        if value is not None:
            out += [flag, str(value)]
    for case in args.case or []:
        out += ["--case", case]
    return out + (["--fail-fast"] if args.fail_fast else [])


def cmd_conformance(args: argparse.Namespace) -> int:
    """Run the conformance suite, write the reports, print failures and ``N passed, N failed``."""
    from rlkernel.conformance import report, runner
    from rlkernel.conformance.progress import StreamProgress

    config = runner.RunConfig(backend=args.backend, device=args.device, ops=args.op, cases=args.case,
                              full=args.full, manifest_path=args.manifest,
                              fail_fast=args.fail_fast, static=args.static)
    if args.jobs < 1:
        print(f"rlkernel conformance: --jobs {args.jobs}: expected a positive number of processes", file=sys.stderr)
        return EXIT_USAGE
    if args.jobs > 1 and args.kit:
        print(f"rlkernel conformance: --jobs {args.jobs} with --kit: the kit records the kernels that ran in one "
              f"process; run --kit without --jobs", file=sys.stderr)
        return EXIT_USAGE
    _sigterm_interrupts()  # a time limit (timeout, a batch system) still gets a report of what ran
    primitives = None
    if args.backend != "reference":  # primitives first: one line names what is wrong on this device
        from rlkernel.conformance.primitives import first_failure, integer_path_line, probe

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            primitives = probe(device)
        except (RuntimeError, ValueError) as exc:  # an unknown device string: the runner reports it below
            primitives = [{"name": "*", "checks": "probes", "status": "error", "detail": str(exc)}]
        line = first_failure(primitives)
        print(line or f"primitives: {len(primitives)} probes pass on {device}", file=sys.stderr)
        try:
            print(integer_path_line(device), file=sys.stderr)
        except (RuntimeError, ValueError) as exc:  # a bad RLKERNEL_GENERIC_INT or device string
            print(f"generic integer sums: {exc}", file=sys.stderr)
    try:
        if args.jobs > 1:
            from rlkernel.conformance.parallel import run_parallel

            result = run_parallel(config, args.jobs, Path(args.out) / "parts", _part_args(args))
        else:
            result = runner.run(config, progress=StreamProgress(sys.stderr))
    except (ValueError, RuntimeError, ImportError) as exc:  # bad arguments, unusable backend, broken install
        print(f"rlkernel conformance: {exc}", file=sys.stderr)
        return EXIT_USAGE
    paths = report.write(result, Path(args.out), command=["rlkernel", *sys.argv[1:]])
    if primitives is not None:
        (Path(args.out) / "primitives.json").write_text(json.dumps(primitives, indent=1) + "\n")
    if args.kit:
        from rlkernel.conformance import kit

        paths["kit"] = kit.write(Path(args.out), result.environment, primitives or [])
    if result.missing_contracts:
        print(f"contracts not present in this tree (not run): {', '.join(result.missing_contracts)}", file=sys.stderr)
    for r in result.records:
        if r.failed and r.status != "not_supported":  # those are summarised below, one entry per op
            print(f"{r.status.upper()} {r.op}/{r.case} ({r.kind}): {r.detail}")
            if r.repro:
                print(f"  reproduce: {r.repro}")
    if report.not_supported_line(result):
        print(f"{report.not_supported_line(result)}: backend {result.backend} has no kernel for them "
              f"(every case is in {paths['json']})")
    print(f"backend {result.backend} on {result.device} ({result.architecture}); reports: "
          + ", ".join(str(p) for p in paths.values()))
    if not result.records:
        print("rlkernel conformance: no case ran; check --op/--case and that the contracts are present",
              file=sys.stderr)
    print(result.final_line())
    return EXIT_OK if result.records and result.ok else EXIT_FAILED


def cmd_static(args: argparse.Namespace) -> int:
    """Compile a backend's kernels for its architectures on this machine (no GPU) and write the
    static-check report: ``report.json`` (every kernel, its findings and code hash) and ``report.md``."""
    from rlkernel.conformance.static import render_markdown
    from rlkernel.registry import get_backend

    try:
        backend = get_backend(args.backend)
    except ValueError as exc:
        print(f"rlkernel static: {exc}", file=sys.stderr)
        return EXIT_USAGE
    make = getattr(backend, "static_report", None)
    if make is None:
        print(f"rlkernel static: backend {args.backend!r} has no static report (rlkernel conformance runs "
              f"its static_checks(), if any)", file=sys.stderr)
        return EXIT_USAGE
    result = make(args.op, args.arch)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["rlkernel", *sys.argv[1:]]) if sys.argv[1:2] == ["static"] else f"rlkernel static --backend " \
        f"{args.backend} --out {args.out}"
    (out / "report.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "report.md").write_text(render_markdown(result, command))
    failed = [k for k in result["kernels"] if k["status"] != "pass"]
    for k in failed:
        print(f"FAIL {k['arch']}/{k['op']}/{k['case']}: {k['error'] or '; '.join(k['findings'][:3])}")
    for arch, counts in result["archs"].items():
        print(f"{arch}: {counts['compiled']} compiled, {counts['passed']} passed, {counts['failed']} failed")
    print(f"reports: {out / 'report.json'}, {out / 'report.md'}")
    return EXIT_FAILED if failed or not result["kernels"] else EXIT_OK


def _bench_result(row: Any) -> str:
    """One bench row in a few words: the ratio, or the errors."""
    ratio = "" if row.ratio is None else f"ratio {row.ratio:.3f}"
    if row.graph_ratio is not None:
        ratio += f", graph {row.graph_ratio:.3f}"
    timings = [row.native, row.rlkernel, row.native_graph, row.rlkernel_graph]
    errors = "; ".join(t.error for t in timings if t is not None and t.error)
    return f"{ratio} {errors}".strip()


def cmd_bench(args: argparse.Namespace) -> int:
    """Benchmark rlkernel ops against native PyTorch; write ``bench.json`` and ``bench.md``.

    An interrupt (Ctrl-C, SIGTERM) writes a partial report of the rows measured so far and
    fails the command.
    """
    from rlkernel import bench
    from rlkernel.conformance.progress import StreamProgress
    from rlkernel.contracts import load_contracts

    try:
        device = torch.device(args.device) if args.device else torch.device(
            "cuda" if torch.cuda.is_available() else "cpu")
        modules, missing = load_contracts(args.op)
    except (ValueError, RuntimeError) as exc:
        print(f"rlkernel bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.op and missing:
        print(f"rlkernel bench: contract module(s) {missing} do not exist yet", file=sys.stderr)
        return EXIT_USAGE
    if args.repeat < 1:
        print(f"rlkernel bench: --repeat must be >= 1, got {args.repeat}", file=sys.stderr)
        return EXIT_USAGE
    shapes = args.shapes or bench.default_shapes(device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_file = out / "bench.rows.jsonl"  # one line per row as it is measured: survives even a SIGKILL
    rows_file.write_text("")

    def save(row: bench.BenchRow) -> None:
        with rows_file.open("a") as f:
            f.write(json.dumps(row.as_dict()) + "\n")

    print(f"rlkernel bench: {shapes} shapes on {device} (--shapes small|large), --repeat {args.repeat}",
          file=sys.stderr)
    _sigterm_interrupts()  # a time limit (timeout, a batch system) still gets a report of what ran
    doc = bench.run(modules, device, args.repeat, shapes=shapes, command=["rlkernel", *sys.argv[1:]],
                    missing=missing, on_row=save, progress=StreamProgress(sys.stderr, describe=_bench_result),
                    graph=args.graph)
    paths = bench.write(doc, out)
    print(bench.markdown(doc), end="")
    errors = sum(1 for r in doc["rows"] if r["rlkernel"]["error"] or r["native"]["error"])
    print(f"{len(doc['rows'])} bench cases, {errors} with errors; wrote " + ", ".join(str(p) for p in paths.values()))
    if doc["partial"]:
        print(f"rlkernel bench: interrupted ({doc['interrupted']}) after {len(doc['rows'])} of "
              f"{doc['cases_planned']} cases; the report is partial", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def cmd_accuracy(args: argparse.Namespace) -> int:
    """Measure every op against float64 next to the native kernels; write ``accuracy.{json,md}``."""
    from rlkernel.conformance.accuracy import report, runner

    device = torch.device(args.device) if args.device else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    size = args.size or ("full" if device.type != "cpu" else "small")
    _sigterm_interrupts()
    try:
        rows = runner.run(device, size, args.op)
    except KeyboardInterrupt:
        print("rlkernel accuracy: interrupted; no report written", file=sys.stderr)
        return EXIT_FAILED
    doc = report.document(rows, device, size, ["rlkernel", *sys.argv[1:]])
    paths = report.write(doc, Path(args.out))
    for row in rows:
        if row["status"] in ("below native", "error"):
            detail = row.get("error") or "{metric} {rlkernel:.3g} vs native {native:.3g}".format(**row["verdict"])
            print(f"{row['status'].upper()} {row['op']}/{row['dataset']}: {detail}")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    print(", ".join(f"{n} {s}" for s, n in sorted(doc["summary"].items())))
    bad = doc["summary"].get("below native", 0) + doc["summary"].get("error", 0)
    return EXIT_FAILED if bad else EXIT_OK


def _int_list(text: str) -> list[int]:
    """``"1,3,8"`` -> ``[1, 3, 8]`` (for flags that take several values)."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _span(text: str) -> tuple[int, int]:
    """``"MIN:MAX"`` (or one number) -> ``(MIN, MAX)``."""
    lo, _, hi = text.partition(":")
    try:
        return int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX, got {text!r}") from None


def cmd_validate(args: argparse.Namespace) -> int:
    """Rollout vs trainer log-probs, bit for bit, next to transformers; ``report.{json,md}`` with ``--out``."""
    from rlkernel.conformance.progress import StreamProgress
    from rlkernel.validate import report
    from rlkernel.validate.record import HashMismatch
    from rlkernel.validate.run import ValidateConfig, run

    if args.train_steps is not None:
        return _validate_train(args)
    flat = [v for values in args.engine_batch for v in values]
    micro = [v for values in args.train_micro_batch for v in values]
    num_prompts = 8 if args.num_prompts is None else args.num_prompts
    cfg = ValidateConfig(
        config=args.config, checkpoint=args.checkpoint, num_prompts=num_prompts, group_size=args.group_size,
        prompt_len=args.prompt_len, max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, stop_token_ids=tuple(args.stop_token_ids or ()), seed=args.seed, device=args.device,
        dtype=args.dtype, engine_batch=flat or [8], train_micro_batch=micro or [1, 3, 8], baseline=args.baseline,
        baseline_dtype=args.baseline_dtype, layers=args.layers, layers_sequences=args.layers_sequences,
        record=args.record, replay=args.replay, save_checkpoint=args.save_checkpoint, block_size=args.block_size,
        enforce_eager=args.enforce_eager)
    command = ["rlkernel", *getattr(args, "argv", sys.argv[1:])]
    threads = args.threads or (1 if args.config == "tiny" and not args.checkpoint else None)
    if threads:
        torch.set_num_threads(threads)
    _sigterm_interrupts()
    try:
        doc = run(cfg, StreamProgress(sys.stderr, describe=lambda step: step.detail), command=command)
    except HashMismatch as exc:
        print(f"rlkernel validate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, ImportError, FileNotFoundError) as exc:
        print(f"rlkernel validate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        print(f"rlkernel validate: interrupted ({exc or 'Ctrl-C'}); no report written", file=sys.stderr)
        return EXIT_FAILED
    doc = report.document(doc)
    for line in report.summary(doc):
        print(line)
    if args.out:
        paths = report.write(doc, Path(args.out))
        print("wrote " + ", ".join(str(p) for p in paths.values()))
    return EXIT_OK if doc["ok"] else EXIT_FAILED


def _validate_train(args: argparse.Namespace) -> int:
    """``rlkernel validate --train-steps N``: N GRPO steps, ours next to the ordinary path (docs/validate.md)."""
    from rlkernel.dispatch import BackwardNotDefined
    from rlkernel.validate import report
    from rlkernel.validate.train import TrainConfig, run_train

    clash = [flag for flag, given in (("--checkpoint", args.checkpoint), ("--replay", args.replay),
                                      ("--record", args.record), ("--layers", args.layers),
                                      ("--save-checkpoint", args.save_checkpoint)) if given]
    if clash:
        print(f"rlkernel validate: --train-steps trains the tiny ReverseDigits model from --seed; {', '.join(clash)} "
              f"belong to the rollout/replay mode (drop them, or drop --train-steps)", file=sys.stderr)
        return EXIT_USAGE
    check = [v for values in args.train_micro_batch_check for v in values]
    cfg = TrainConfig(
        steps=args.train_steps, seed=args.seed, device=args.device, dtype=args.dtype,
        num_prompts=4 if args.num_prompts is None else args.num_prompts, group_size=args.group_size,
        temperature=args.temperature, lr=args.lr, weight_decay=args.weight_decay, kl_coef=args.kl_coef,
        loss_agg_mode=args.loss_agg_mode, micro_batch=args.grpo_micro_batch,
        max_grad_norm=args.max_grad_norm if args.max_grad_norm > 0 else None, micro_batch_check=check,
        baseline=args.baseline, baseline_dtype=args.baseline_dtype, hidden_size=args.hidden_size,
        num_layers=args.num_layers, max_digits=args.max_digits, init_std=args.init_std)
    command = ["rlkernel", *getattr(args, "argv", sys.argv[1:])]
    torch.set_num_threads(args.threads or 1)  # the tiny model's ops gain nothing from more threads
    _sigterm_interrupts()
    printed_header: list[bool] = []

    def on_step(ours: Any, theirs: Any) -> None:
        if not printed_header:
            for line in report.train_header(theirs is not None):
                print(line)
            printed_header.append(True)
        print(report.train_row(ours.as_dict(), theirs.as_dict() if theirs is not None else None), flush=True)

    def on_check(mb: int, sha: str) -> None:
        print(f"micro-batch check: micro-batch {mb} -> final weights sha256 {sha}", flush=True)

    try:
        doc = run_train(cfg, on_step=on_step, on_check=on_check, command=command)
    except BackwardNotDefined as exc:
        print(f"rlkernel validate: this build cannot train: an op on the training path has no backward yet ({exc})",
              file=sys.stderr)
        return EXIT_FAILED
    except (ValueError, ImportError) as exc:
        print(f"rlkernel validate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        print(f"rlkernel validate: interrupted ({exc or 'Ctrl-C'}); no report written", file=sys.stderr)
        return EXIT_FAILED
    doc = report.document(doc)
    for line in report.summary(doc):
        print(line)
    if args.out:
        paths = report.write(doc, Path(args.out))
        print("wrote " + ", ".join(str(p) for p in paths.values()))
    return EXIT_OK if doc["ok"] else EXIT_FAILED


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlkernel", description="Bitwise-reproducible kernels for RL post-training.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="versions, devices, backends and contracts")
    info.set_defaults(func=cmd_info)

    conf = sub.add_parser("conformance", help="run the conformance suite against a backend")
    conf.add_argument("--backend", help="backend name, or 'reference' to check the reference against the "
                      "manifest (default: the backend serving the default device)")
    conf.add_argument("--device", help="device under test: cpu, cuda, cuda:1, ... (default: cuda if available, "
                      "else cpu)")
    conf.add_argument("--out", default="conformance-report", help="report directory (default: %(default)s)")
    conf.add_argument("--op", action="append", help="contract module to run (repeatable; default: all present)")
    conf.add_argument("--case", action="append", help="case name to run (repeatable; default: all)")
    mode = conf.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="full", action="store_false", help="skip full_only cases (default)")
    mode.add_argument("--full", dest="full", action="store_true", help="run every case, large shapes included")
    conf.add_argument("--manifest", type=Path, default=None, help="golden manifest (default: the packaged one)")
    conf.add_argument("--fail-fast", action="store_true",
                      help="stop at the first case that does not pass (the cases left count as not run)")
    conf.add_argument("--kit", action="store_true",
                      help="also write environment.json, kernels.json (code hashes of the kernels that ran) and "
                           "MANIFEST.sha256, and pack OUT.tar.gz to send back (docs/conformance-kit.md)")
    conf.add_argument("--jobs", type=int, default=1, metavar="N",
                      help="run the contract modules in N processes (groups of about equal case counts) beside "
                           "the static checks, and merge their reports into one: a first run on a new GPU is "
                           "mostly kernel compilation, which one process does one kernel at a time (default: 1)")
    conf.add_argument("--no-static", dest="static", action="store_false",
                      help="skip the static checks of compiled kernels (the phase a run ends with)")
    conf.set_defaults(func=cmd_conformance, full=False)

    static = sub.add_parser("static", help="compile a backend's kernels for its architectures (no GPU) and "
                            "check the machine code; writes the static-check report")
    static.add_argument("--backend", required=True, help="backend with a static report (rocm)")
    static.add_argument("--arch", action="append", help="architecture (repeatable; default: every one of the "
                        "backend's that the installed Triton compiles for)")
    static.add_argument("--op", action="append", help="op to compile (repeatable; default: all)")
    static.add_argument("--out", default="static-report", help="output directory (default: %(default)s)")
    static.set_defaults(func=cmd_static)

    acc = sub.add_parser("accuracy", help="measure every op against float64, next to the native kernels")
    acc.add_argument("--device", help="device (default: cuda if available, else cpu)")
    acc.add_argument("--size", choices=("small", "full"),
                     help="problem sizes: small (CI, seconds on a CPU) or full (Qwen3 widths, long context; "
                          "default on accelerators)")
    acc.add_argument("--op", action="append", help="public op to measure (repeatable; default: all)")
    acc.add_argument("--out", default="accuracy-report", help="output directory (default: %(default)s)")
    acc.set_defaults(func=cmd_accuracy)

    bench = sub.add_parser("bench", help="time rlkernel ops against native PyTorch ops")
    bench.add_argument("--op", action="append", help="contract module to bench (repeatable; default: all present)")
    bench.add_argument("--device", help="device (default: cuda if available, else cpu)")
    bench.add_argument("--out", default="bench-report", help="output directory (default: %(default)s)")
    bench.add_argument("--repeat", type=int, default=10,
                       help="timed calls per side on the CPU; on CUDA do_bench runs 10*N ms (default: %(default)s)")
    bench.add_argument("--shapes", choices=("small", "large"),
                       help="shape set: small (a whole CPU run in minutes) or large (the Qwen3-8B shapes of the "
                       "H200 reports); default: small on cpu, large on an accelerator")
    bench.add_argument("--graph", choices=("auto", "all", "none"), default="auto",
                       help="also time cases replayed from CUDA graphs (CUDA only): auto = the decode-step "
                            "cases (default: %(default)s)")
    bench.set_defaults(func=cmd_bench)

    val = sub.add_parser("validate", help="rollout vs trainer log-probs, bit for bit, next to transformers",
                         description="Generate with rlkernel's rollout engine, replay the completions through the "
                         "trainer forward in other batchings and count the tokens whose log-probs differ (expected "
                         "0); optionally layer by layer, and the same through transformers (docs/validate.md).")
    model = val.add_argument_group("model")
    model.add_argument("--checkpoint", metavar="DIR", help="Hugging Face checkpoint directory (default: random "
                       "weights of --config from --seed, written nowhere unless --save-checkpoint)")
    model.add_argument("--config", default="tiny", choices=("tiny", "qwen3-0.6b"),
                       help="random model shape (default: %(default)s; qwen3-0.6b: Qwen3-0.6B's shapes)")
    model.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"),
                       help="model dtype (default: %(default)s)")
    model.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda if available, else cpu)")
    model.add_argument("--save-checkpoint", metavar="DIR", help="write the model as a checkpoint directory")
    work = val.add_argument_group("rollout")
    work.add_argument("--num-prompts", type=int, help="prompts (default: 8; with --train-steps: 4 per step)")
    work.add_argument("--group-size", type=int, default=4, help="samples per prompt, n (default: %(default)s)")
    work.add_argument("--prompt-len", type=_span, default=(4, 24), metavar="MIN:MAX",
                      help="prompt lengths, uniform (default: 4:24)")
    work.add_argument("--max-tokens", type=int, default=16, help="completion tokens at most (default: %(default)s)")
    work.add_argument("--temperature", type=float, default=1.0, help="(default: %(default)s; 0 = greedy)")
    work.add_argument("--top-k", type=int, default=0, help="(default: %(default)s = off)")
    work.add_argument("--top-p", type=float, default=1.0, help="(default: %(default)s = off)")
    work.add_argument("--stop-token-ids", type=_int_list, metavar="IDS", help="comma-separated stop token ids")
    work.add_argument("--seed", type=int, default=0,
                      help="weights, prompts, sampling seeds and packing orders (default: %(default)s)")
    work.add_argument("--engine-batch", type=_int_list, action="append", default=[], metavar="N[,N...]",
                      help="engine max_num_seqs; several values = one rollout each, all must agree (default: 8)")
    work.add_argument("--block-size", type=int, default=16, help="KV cache block size (default: %(default)s)")
    work.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs in the engine")
    work.add_argument("--threads", type=int, help="torch intra-op CPU threads (default: 1 for the tiny random "
                      "config, whose ops are too small to gain from more and lose much to thread wake-ups on a busy "
                      "machine; torch's default otherwise)")
    check = val.add_argument_group("checks")
    check.add_argument("--train-micro-batch", type=_int_list, action="append", default=[], metavar="N[,N...]",
                       help="trainer micro-batch sizes, each a replay in a shuffled packing order (default: 1,3,8)")
    check.add_argument("--baseline", default="auto", choices=("transformers", "none", "auto"),
                       help="side-by-side path (default: %(default)s = transformers when installed)")
    check.add_argument("--baseline-dtype", choices=("bfloat16", "float16", "float32"),
                       help="transformers model dtype (default: --dtype)")
    check.add_argument("--layers", action="store_true", help="layer-by-layer check of the first sequences")
    check.add_argument("--layers-sequences", type=int, default=4,
                       help="sequences in the layer-by-layer check (default: %(default)s)")
    check.add_argument("--record", metavar="FILE", help="write the rollout to a record file (safetensors)")
    check.add_argument("--replay", metavar="FILE", help="replay a record instead of generating")
    check.add_argument("--out", metavar="DIR", help="write report.json and report.md here")
    train = val.add_argument_group(
        "training (--train-steps N)", "N GRPO steps of the tiny ReverseDigits model (initial weights from --seed) "
        "with rlkernel's GRPOTrainer, next to the ordinary PyTorch path (transformers generate + full forward, "
        "torch AdamW) unless --baseline none; fails if any of ours' rollout/trainer log-probs mismatch. Also uses "
        "--num-prompts (per step), --group-size, --temperature, --seed, --device, --dtype, --baseline(-dtype), "
        "--threads and --out")
    train.add_argument("--train-steps", type=int, metavar="N", help="run the N-step training mode")
    train.add_argument("--grpo-micro-batch", type=int, metavar="N",
                       help="sequences per forward/backward, both sides (default: the whole step's batch)")
    train.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default: %(default)s)")
    train.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default: %(default)s)")
    train.add_argument("--kl-coef", type=float, default=0.0,
                       help="k3 KL to the initial model, weight (default: %(default)s = no reference model)")
    train.add_argument("--loss-agg-mode", default="token-mean", choices=("token-mean", "seq-mean-token-mean"),
                       help="loss aggregation (default: %(default)s)")
    train.add_argument("--max-grad-norm", type=float, default=1.0,
                       help="global-norm gradient clip; 0 = none (default: %(default)s)")
    train.add_argument("--hidden-size", type=int, default=64, help="tiny model width (default: %(default)s)")
    train.add_argument("--num-layers", type=int, default=2, help="tiny model layers (default: %(default)s)")
    train.add_argument("--max-digits", type=int, default=4,
                       help="longest ReverseDigits prompt, 2..N digits (default: %(default)s)")
    train.add_argument("--init-std", type=float, default=0.02, help="initial weights' std (default: %(default)s)")
    train.add_argument("--train-micro-batch-check", type=_int_list, action="append", default=[], metavar="N[,N...]",
                       help="run ours again once per micro-batch size from the same weights; all must end with "
                            "the same weights sha256")
    val.set_defaults(func=cmd_validate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rlkernel`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
