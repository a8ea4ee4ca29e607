"""`lpt`: the command line. Every command only parses arguments, calls the library and formats."""

from __future__ import annotations

import functools
import json
import logging
import sys
from pathlib import Path

import click
from click.core import ParameterSource

import lpt
from cli.calibrate import (batch_axis_option, int8_recurrent_option, overflow_fix_option, ray_options, say_narrowed,
                           say_recurrent, say_smoothed, smooth_quant_option)
from cli.data_options import DataOptions, data_options, open_folder, say_skipped
from lpt.data.suggest import suggest as suggest_data
from lpt.calibration import Estimator
from cli.shared import Table, at_least, bounded_threads, console, say
from lpt import limits, paths
from lpt.calibration.data import parse_batch_axes
from lpt.errors import shown


def _one_line_errors(command):
    """Turn lpt's errors (and anything unexpected) into one line on stderr and exit code 1.

    The command runs with a lpt.paths.Files watching what it reads, passed as `files`: it declares
    its inputs and outputs there before the work, and no write replaces a file it reads. Its
    --max-memory (added to every command by _add_max_memory) is the lpt.limits budget it runs under."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        debug = click.get_current_context().find_root().params.get("debug")
        max_memory = kwargs.pop("max_memory", None)
        try:
            budget = limits.parse_size(max_memory) if max_memory is not None else None
            with paths.watching() as files, limits.memory_budget(budget):
                return command(*args, files=files, **kwargs)
        except lpt.LptError as err:
            click.echo(f"error: {_one_line(err)}", err=True)
        except Exception as err:  # noqa: BLE001 - the CLI promises no tracebacks
            if debug:
                raise
            click.echo(f"error: {type(err).__name__}: {_one_line(err)} (rerun with --debug for the traceback)", err=True)
        sys.exit(1)

    return wrapper


def _one_line(err: BaseException) -> str:
    """The message on one line (onnxruntime's messages, for one, end in a newline), escaped: names
    from a file may hold escape sequences (lpt.errors.shown)."""
    return shown(" ".join(str(err).split()) or type(err).__name__)


class _EscapedFormatter(logging.Formatter):
    """Log messages escaped like errors (tracebacks, with --debug, keep their lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return shown(super().formatMessage(record))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(lpt.__version__, prog_name="lpt")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logging.")
def main(debug: bool) -> None:
    """lpt: OpenVINO-style int8 quantization for ONNX models.

    \b
    Examples:
      lpt inspect models/digits_cnn.ort_qdq.onnx      what is fake-quantized, and how
      lpt normalize models/digits_cnn.ov_fq.onnx -o digits_qdq.onnx
    """
    handler = logging.StreamHandler()
    handler.setFormatter(_EscapedFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, handlers=[handler])
    if not debug:
        import onnxruntime

        # onnxruntime logs its failures to stderr on its own, in colour, before lpt reports them in one line
        onnxruntime.set_default_logger_severity(4)


@main.command()
@click.argument("model", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead of tables.")
@_one_line_errors
def inspect(model: str, as_json: bool, files: paths.Files) -> None:
    """Show MODEL's ops, its fake-quantized tensors, and heavy ops left in float.

    Any FakeQuantize-equivalent form is recognized: QuantizeLinear/DequantizeLinear pairs,
    OpenVINO's FakeQuantize, arithmetic chains, QLinearConv/QLinearMatMul, ConvInteger.

    \b
    Example:
      lpt inspect models/digits_cnn.ort_qdq.onnx
      lpt inspect models/digits_cnn.ort_qdq.onnx --json > summary.json

    For an input that looks like an image or audio, the last lines say how a folder of such files
    would be read (--data DIR) and which options change it.
    """
    model = files.model(model)
    loaded = lpt.load(model)
    summary = lpt.summarize(loaded)
    data_lines = suggest_data(loaded)  # image- or audio-like inputs: the --data options lpt would infer
    if as_json:
        click.echo(json.dumps({**summary.to_dict(), "data": data_lines}, indent=2))
        return
    ops = Table(title=f"{model.name}: ops", title_justify="left")
    ops.add_column("op")
    ops.add_column("count", justify="right")
    for op, count in summary.op_counts.items():
        ops.add_row(op, str(count))
    console.print(ops)
    fqs = Table(title=f"fake-quantized tensors ({len(summary.fake_quantized)})", title_justify="left")
    for column in ("tensor", "kind", "levels", "dtype", "granularity", "range", "symmetric", "semantics"):
        fqs.add_column(column)
    for t in summary.fake_quantized:
        fqs.add_row(t.tensor, t.kind, str(t.levels), t.dtype, t.granularity, f"[{t.low:.4g}, {t.high:.4g}]",
                    "yes" if t.symmetric else "no", t.semantics)
    console.print(fqs)
    if summary.precisions:
        _print_precisions(summary.precisions)
    if summary.unquantized:
        left = Table(title="quantizable ops without quantized inputs", title_justify="left")
        for column in ("node", "op", "why"):
            left.add_column(column)
        for u in summary.unquantized:
            left.add_row(u.node, u.op_type, u.reason)
        console.print(left)
    else:
        say("every Conv/ConvTranspose/MatMul/Gemm reads fake-quantized inputs")
    for line in data_lines:
        say(line)


def _print_precisions(precisions) -> None:
    counts = {}
    for p in precisions:
        counts[p.precision] = counts.get(p.precision, 0) + 1
    table = Table(title="op precision: " + ", ".join(f"{n} {k}" for k, n in counts.items()), title_justify="left")
    for column in ("node", "op", "runs in", "why f32"):
        table.add_column(column)
    for p in precisions:
        style = "yellow" if p.precision == "f32" else None
        table.add_row(p.node, p.op_type, p.precision, p.reason, style=style)
    console.print(table)


@main.command()
@click.argument("model", type=click.Path())
@click.option("-o", "--output", type=click.Path(), required=True, help="Where to write the int8 graph.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists (never the input).")
@click.option("--quiet", is_flag=True, help="Print only where the graph was written.")
@_one_line_errors
def transform(model: str, output: str, force: bool, quiet: bool, files: paths.Files) -> None:
    """Run the low precision transformations on a fake-quantized MODEL and save the int8 graph.

    FakeQuantizes split into quantize + dequantize, dequantizations move down the graph,
    weights become int8 constants, and Conv/MatMul/Gemm run as ConvInteger/MatMulInteger.
    The table says which ops run on integers and why the others stay f32.

    \b
    Example:
      lpt transform models/digits_cnn.ort_qdq.onnx -o digits_int8.onnx
    """
    model = files.model(model)
    output = files.output(output, "-o", force=force)
    m = lpt.load(model)
    lpt.transform(m)
    lpt.save(m, output, overwrite=force)
    if not quiet:
        _print_precisions(lpt.op_precisions(m, lpt.compile_model(m)))
    click.echo(shown(f"wrote {output}"))


@main.command()
@click.argument("model", type=click.Path())
@click.option("-o", "--output", type=click.Path(), required=True, help="Where to write the model.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists (never the input).")
@_one_line_errors
def normalize(model: str, output: str, force: bool, files: paths.Files) -> None:
    """Load MODEL, normalize its FakeQuantize forms, and save it as standard ONNX.

    QDQ-semantics fake quantization is written as QuantizeLinear/DequantizeLinear (bit-exact),
    everything else as OpenVINO's FakeQuantize op.

    \b
    Example:
      lpt normalize models/digits_cnn.ort_qdq.onnx -o digits_normalized.onnx
    """
    model = files.model(model)
    output = files.output(output, "-o", force=force)
    normalized = lpt.load(model)
    lpt.save(normalized, output, overwrite=force)
    click.echo(shown(f"wrote {output}"))


def _default_data(model: Path, data: str | None) -> str | Path:
    """--data, or the .npz that sits beside the model (as in models/)."""
    from lpt.calibration.data import data_beside

    return data if data is not None else data_beside(model)


@main.command()
@click.argument("model", type=click.Path())
@click.option("--data", type=click.Path(), help="Inputs: .npz keyed by input name, .npy, or a folder "
              "of them, or a folder of images or audio (options below). Default: MODEL's .npz beside it.")
@click.option("-o", "--output", type=click.Path(), help="Write the outputs here (.npz keyed by output name).")
@click.option("--check", is_flag=True, help="Cross-check against onnxruntime on the FQ model and on lpt's export.")
@click.option("--batch-size", default=32, show_default=True, help="Samples per run of the plan.")
@click.option("--threads", default=0, show_default=True, help="Threads of the integer GEMM and the onnxruntime "
              "fallback; 0: one per core (more than the cores are capped).")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists.")
@batch_axis_option
@_one_line_errors
@data_options
def run(model: str, data: str | None, output: str | None, check: bool, batch_size: int, threads: int,
        force: bool, batch_axes: tuple[str, ...], data_options: DataOptions, files: paths.Files) -> None:
    """Run MODEL on lpt's int8 backend.

    MODEL is a fake-quantized model (transformed on the fly) or an int8 graph saved by
    `lpt transform`. Prints how many ops ran on int8 kernels and which fell back to
    onnxruntime; with --check, how far lpt is from onnxruntime, in LSBs per quantized tensor.

    \b
    Example:
      lpt run models/digits_cnn.ort_qdq.onnx --data models/digits_cnn.test.npz -o out.npz --check
      lpt run model.fq.onnx --data photos/     preprocessed as recorded when model.fq.onnx was calibrated
    """
    at_least("--batch-size", batch_size, 1)
    threads = bounded_threads("--threads", threads, 0)
    axes = parse_batch_axes(batch_axes)
    model = files.model(model)
    data = files.data(_default_data(model, data))
    data = open_folder(data, model, data_options, batch_axes=axes)  # a folder of images or audio
    output = files.output(output, "-o", force=force)
    result = lpt.run(model, data, batch_size=batch_size, check=check, threads=threads, batch_axes=axes)
    say_skipped(data)
    if output is not None:
        lpt.model_io.write_arrays(result.outputs, output, overwrite=force)
    split = ", ".join(f"{n} on {backend}" for backend, n in result.op_split.items())
    fallback = ", ".join(f"{op}×{n}" for op, n in result.plan.fallback_ops().items()) or "none"
    samples = len(next(iter(result.outputs.values())))
    click.echo(shown(f"{samples} samples in {result.seconds:.3f} s; ops: {split}; not on int8 kernels: {fallback}"))
    if result.check is not None:
        _print_check(result.check)
    if output is not None:
        click.echo(shown(f"wrote {output}"))


def _share(fraction: float) -> str:
    """A share of values, never rounded up to 100% when one differs."""
    return "100%" if fraction == 1 else f"{min(fraction, 0.99999):.3%}"


def _print_check(check) -> None:
    if check.tensors:
        table = Table(title=f"lpt vs the FQ model: max {check.max_lsb} LSB end to end ({_share(check.share_exact)} "
                            f"exactly equal), max {check.max_local_lsb} LSB per layer", title_justify="left")
        for column in ("quantized tensor", "max LSB", "exactly equal", "max LSB, layer alone", "values"):
            table.add_column(column)
        for t, alone in zip(check.tensors, check.local):
            table.add_row(t.tensor, str(t.max_lsb), _share(t.share_exact), str(alone.max_lsb), str(t.size))
        console.print(table)
    else:  # a model quantized at run time (DynamicQuantizeLinear) has no fixed levels to compare
        say("lpt vs the FQ model: it has no fake-quantized tensor to compare layer by layer; its outputs:")
    outputs = Table(title="outputs (f32)", title_justify="left")
    for column in ("output", "against", "max |diff|", "exactly equal", "why they may differ"):
        outputs.add_column(column)
    for o in check.outputs:
        outputs.add_row(o.output, o.against, f"{o.max_abs_diff:.3g}", _share(o.share_equal), o.note)
    console.print(outputs)
    for note in check.export_notes:
        say(f"  export: {note}")
    _say_engines(check)


def _say_engines(check) -> None:
    """Which engine computed the int8 layers, and how far the native one is from lpt's reference kernels."""
    from lpt import native

    engines = ", ".join(f"{n} on {engine}" for engine, n in check.engines.items()) or "none"
    say(f"int8 layers: {engines}" + ("" if native.available() else f" (native engine: {native.unavailable_reason()})"))
    if check.engine is not None:
        e = check.engine
        say(f"  native engine vs lpt's NumPy/MLAS kernels: max {e.max_lsb} LSB over {e.tensors} integer tensors "
            f"({_share(e.share_exact)} exactly equal)")
        if e.programs:
            say(f"  {e.programs} run(s) of steps as one native call each, outputs "
                + ("equal to the steps run one by one" if e.programs_exact else "DIFFERENT from the steps run one by one"))


@main.command()
@click.argument("model", type=click.Path())
@click.option("-o", "--output", type=click.Path(), required=True, help="Where to write the ONNX int8 model.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists (never the input).")
@_one_line_errors
def export(model: str, output: str, force: bool, files: paths.Files) -> None:
    """Export MODEL (fake-quantized or lpt int8) as standard ONNX int8 that onnxruntime runs.

    Integer Conv/MatMul chains become QLinearConv/QLinearMatMul where ONNX has the form
    (ConvInteger/MatMulInteger otherwise); the rounding differences this brings are listed.

    \b
    Example:
      lpt export models/digits_cnn.ort_qdq.onnx -o digits_int8_ort.onnx
    """
    model = files.model(model)
    output = files.output(output, "-o", force=force)
    m = lpt.load(model)
    lpt.transform(m)
    exported, report = lpt.export_int8(m)
    lpt.model_io.write_model(exported, output, overwrite=force)
    click.echo(f"{len(report.fused)} QLinear ops; {len(report.approximated)} places round differently than lpt")
    click.echo(shown(f"wrote {output}"))


@main.command()
@click.argument("model", type=click.Path())
@click.option("--data", type=click.Path(),
              help="Sample inputs (.npz keyed by input name, .npy, or a folder of them), or a folder of images or "
                   "audio (options below; class subfolders give labels). Default: MODEL's .npz beside it.")
@click.option("-o", "--output-prefix", type=click.Path(),
              help="Write PREFIX.fq.onnx and PREFIX.int8.onnx. Default: beside MODEL, named after it.")
@click.option("--preset", type=click.Choice(["performance", "mixed"]), help="Activation scheme (default: the "
              "calibration default, see README).")
@click.option("--estimator", type=click.Choice([e.value for e in Estimator]),
              help="Range estimator for activations (auto: per tensor, the candidate with the least error "
                   "at the output of the layers reading it; a second pass over the data).")
@click.option("--subset-size", default=300, show_default=True, help="Samples used to calibrate and to check.")
@click.option("--ignore", multiple=True, help="Leave in f32: a node name, re:REGEX, or an op type. Repeatable.")
@click.option("--no-bias-correction", is_flag=True, help="Skip fast bias correction.")
@overflow_fix_option
@smooth_quant_option
@int8_recurrent_option
@click.option("--recalibrate", is_flag=True, help="Calibrate afresh even if MODEL is already fake-quantized.")
@click.option("--dynamic", is_flag=True, help="Dynamic quantization (onnxruntime's quantize_dynamic form), no "
              "calibration: MatMul/Gemm weights 8-bit per channel, activation ranges measured at run time "
              "(DynamicQuantizeLinear), LSTM/GRU input weights int8; the data only measures agreement with fp32. "
              "E.g. lpt quantize plcmos_v2.onnx --dynamic --data samples.npz")
@click.option("--skip-nonfinite", is_flag=True, help="Skip samples holding NaN/Inf (with a warning) instead of refusing the data.")
@click.option("--json", "json_path", type=click.Path(), help="Also write the report as JSON here.")
@click.option("--force", is_flag=True, help="Replace existing outputs (never the input).")
@click.option("--quiet", is_flag=True, help="No progress output.")
@click.option("--max-drop", type=float, metavar="PT", help="Accuracy control: revert the layers whose quantization "
              "costs most to f32, the fewest that keep the top-1 drop against fp32 at most PT points on the "
              "evaluation data (needs --labels). E.g. --max-drop 0.5 --labels labels --eval-data test.npz")
@click.option("--min-sqnr", type=float, metavar="DB", help="Accuracy control without labels: revert until the "
              "output SQNR against fp32 (worst output) is at least DB. E.g. --min-sqnr 42")
@click.option("--labels", "labels_key", help="The key of the labels in the evaluation data, for --max-drop; for "
              "a folder of images or audio without class subfolders, a CSV file,label. With labels in --data, "
              "the report gives fp32 and int8 top-1 (and top-5). E.g. --labels labels, --labels photos.csv")
@click.option("--eval-data", type=click.Path(), help="Where --max-drop/--min-sqnr are measured: every sample of "
              "this .npz/.npy/folder. Default: the --data samples, which also calibrate; give held-out ones "
              "(e.g. models/digits_zoo.test.npz).")
@click.option("--max-time", type=float, default=600, show_default=True, metavar="SECONDS",
              help="Stop the accuracy search after SECONDS; the best model found is written either way.")
@batch_axis_option
@ray_options
@_one_line_errors
@data_options
def quantize(model: str, data, output_prefix, preset, estimator, subset_size, ignore, no_bias_correction, overflow_fix,
             smooth_quant, int8_recurrent, recalibrate,
             skip_nonfinite, json_path, force, quiet, max_drop, min_sqnr, labels_key, eval_data, max_time, batch_axes,
             data_options: DataOptions, files: paths.Files, dynamic: bool = False, ray: str | None = None,
             ray_workers: int | None = None) -> None:
    """Quantize MODEL to int8 and tell how it went: the whole pipeline in one command.

    An fp32 MODEL is calibrated on the data and fake-quantized; a model that is already
    fake-quantized (QDQ, OpenVINO FakeQuantize, QLinearConv, ...) goes straight on. Then the
    low precision transformations make the int8 graph, lpt's int8 backend runs it on the data
    and cross-checks it against onnxruntime, and the fp32-vs-int8 agreement is reported.

    With --max-drop or --min-sqnr (accuracy control), the layers are ranked once by what their
    quantization costs, and the fewest of the worst are reverted to f32 until the target holds on
    --eval-data; the report lists the ranking, what was reverted, the metric and lpt's latency
    before and after. When the target is missed, the best model found is still written, the
    report says so, and the exit code is 2.

    \b
    Example:
      lpt quantize models/digits_cnn.onnx
      lpt quantize my_model.onnx --data samples.npz --preset mixed -o build/my_model
      lpt quantize models/digits_zoo.onnx --max-drop 0.3 --labels labels --eval-data models/digits_zoo.test.npz
      lpt quantize models/digits_transformer.onnx --smooth-quant 0.5      SmoothQuant before placement
      lpt quantize resnet.onnx --data photos/ --preprocess imagenet      photos/CLASS/*.jpg: top-1 and top-5
      lpt quantize speech_gru.onnx --dynamic --data samples.npz          no calibration: quantize_dynamic's form
      lpt quantize speech_gru.onnx --int8-recurrent --data samples.npz   LSTM/GRU recurrences on int8 too
      lpt quantize resnet.onnx --data photos/ --preprocess imagenet --ray      passes over the data on Ray workers
    """
    at_least("--subset-size", subset_size, 1)
    if dynamic and click.get_current_context().get_parameter_source("overflow_fix") == ParameterSource.DEFAULT:
        overflow_fix = None  # static calibration's default; --dynamic refuses only an explicit --overflow-fix
    axes = parse_batch_axes(batch_axes)
    model = files.model(model)
    data = files.data(_default_data(model, data))
    if eval_data is not None:
        eval_data = files.data(eval_data, "the evaluation data")
    # a folder of images or audio: its files (inputs, never overwritten), labels and preprocessing
    data = open_folder(data, model, data_options, labels=labels_key, batch_axes=axes)
    if eval_data is not None:
        eval_data = open_folder(eval_data, model, data_options, labels=labels_key, batch_axes=axes)
    if output_prefix == "":
        raise lpt.errors.OutputError("-o: the output prefix is empty")
    prefix = output_prefix or model.with_suffix("")
    for suffix in (".fq.onnx", ".int8.onnx"):
        files.output(f"{prefix}{suffix}", "-o" if output_prefix else "the default output", force=force)
    json_path = files.output(json_path, "--json", force=force)
    status = console.status("loading") if not quiet and console.is_terminal else None
    if status is not None:
        status.start()
    try:
        result = lpt.quantize(model, data, preset=preset,
                              estimator=estimator, subset_size=subset_size, ignore=ignore,
                              bias_correction=not no_bias_correction, recalibrate=recalibrate, dynamic=dynamic,
                              skip_nonfinite=skip_nonfinite, batch_axes=axes,
                              max_drop=max_drop, min_sqnr=min_sqnr, labels=labels_key, eval_data=eval_data,
                              max_time=max_time, overflow_fix=overflow_fix, smooth_quant=smooth_quant,
                              int8_recurrent=int8_recurrent,
                              quiet=quiet or not console.is_terminal,
                              ray=ray, ray_workers=ray_workers,
                              on_stage=(lambda name: status.update(name)) if status is not None else None)
    finally:
        if status is not None:
            status.stop()
    fq_path, int8_path = result.save(prefix, overwrite=force)  # both checked before either is written
    if json_path is not None:
        lpt.model_io.write_bytes(json.dumps(result.report.to_dict(), indent=2).encode(), json_path, overwrite=force)
    _print_quantize_report(result.report)
    say_skipped(data)
    click.echo(shown(f"wrote {fq_path} and {int8_path}"))
    control = result.report.accuracy_control
    if control is not None and not control.met:
        click.echo(f"warning: accuracy target missed ({control.target.describe()}): wrote the best model found",
                   err=True)
        sys.exit(2)


def _print_quantize_report(report) -> None:
    if report.calibration is not None:
        c = report.calibration
        inserted = ", ".join(f"{n} {kind}" for kind, n in c.fake_quantizes.items())
        say(f"calibrated on {c.samples} samples ({c.preset} preset, {c.estimator} estimator): "
                      f"FakeQuantize on {inserted}")
        for skipped in c.left_f32:
            say(f"  left f32: {skipped.node} ({skipped.op_type}): {skipped.reason}")
        say_narrowed(c)
        say_smoothed(c)
        say_recurrent(c)
    elif report.dynamic is not None:
        _print_dynamic(report.dynamic)
    else:
        console.print("the model was already fake-quantized: calibration skipped")
    ops = report.to_dict()["ops"]
    say(f"int8 graph: {ops['int8']} int8 ops, {ops['quantize']} quantize, {ops['dequantize']} dequantize, "
                  f"{ops['fused']} f32 ops fused into int8 kernels, {ops['f32']} f32")
    for p in report.precisions:
        if p.precision == "f32":
            say(f"  f32: {p.node} ({p.op_type}): {p.reason}")
    check = report.check
    say(f"cross-check vs the FQ model: max {check.max_lsb} LSB end to end over {len(check.tensors)} quantized "
                  f"tensors ({_share(check.share_exact)} exactly equal), max {check.max_local_lsb} LSB per layer alone")
    for o in check.outputs:
        say(f"  {o.output} vs {o.against}: max |diff| {o.max_abs_diff:.3g}" + (f" ({o.note})" if o.note else ""))
    _say_engines(check)
    agreement = report.agreement
    reference = "fp32" if report.calibration is not None or report.dynamic is not None else "the FQ model"
    for name, a in agreement.outputs.items():
        say(f"{reference} vs int8 on lpt's backend, {name}: SQNR {a.sqnr_db:.1f} dB, cosine {a.cosine:.6f}, "
                      f"max |err| {a.max_abs_error:.3g}")
    if agreement.top1 is not None:
        say(f"  top-1 agreement with {reference}: {agreement.top1.agreement:.2%}")
    if agreement.top1 is not None and agreement.has_labels:
        _say_accuracy(agreement.top1, reference, "int8")
    if report.accuracy_control is not None:
        _print_accuracy_control(report.accuracy_control)
    console.print("time: " + ", ".join(f"{k} {v:.2f} s" for k, v in report.seconds.items()))


def _print_dynamic(dynamic) -> None:
    say(f"quantized dynamically (no calibration): {len(dynamic.quantized)} ops with run-time activation scales, "
        f"{len(dynamic.weights_only)} recurrent ops with int8 weights, {len(dynamic.left_f32)} left f32")
    for op in dynamic.quantized + dynamic.weights_only:
        say(f"  {op.node} ({op.op_type}): {op.how}")
    for op in dynamic.left_f32:
        say(f"  left f32: {op.node} ({op.op_type}): {op.how}")


def _say_accuracy(top1, reference: str, candidate: str) -> None:
    """Top-1 (and top-5, with five classes or more) of both models on the labelled samples, side by side."""
    say(f"  top-1 on {top1.count} labelled samples: {reference} {top1.reference_accuracy:.2%}, {candidate} "
        f"{top1.candidate_accuracy:.2%} (drop {100 * (top1.reference_accuracy - top1.candidate_accuracy):.2f} pt)")
    if top1.top5:
        say(f"  top-5: {reference} {top1.reference_top5:.2%}, {candidate} {top1.candidate_top5:.2%} "
            f"(drop {100 * (top1.reference_top5 - top1.candidate_top5):.2f} pt)")


def _print_accuracy_control(control) -> None:
    def measured(m) -> str:
        top1 = "" if m.top1 is None else f"top-1 {m.top1:.2%} (fp32 {m.reference_top1:.2%}, drop {m.drop_pt:.2f} pt), "
        return f"{top1}SQNR {m.sqnr_db:.2f} dB"

    samples = "" if control.samples is None else f" on {control.samples} samples"
    say(f"accuracy control: {control.target.describe()}{samples}: "
        + ("met" if control.met else "MISSED, the best model found is written"))
    table = Table(title=f"layers, worst quantization first: {len(control.reverted)} of {len(control.ranking)} "
                        "reverted to f32", title_justify="left")
    for column in ("layer", "op", "worst FQ'd input", "SQNR of its quantization dB", "reverted"):
        table.add_column(column)
    reverted = {layer.name for layer in control.reverted}
    for layer in control.ranking:
        table.add_row(layer.name, layer.op, layer.tensor or "-", f"{layer.sqnr_db:.2f}",
                      "yes" if layer.name in reverted else "", style="yellow" if layer.name in reverted else None)
    console.print(table)
    say(f"  before: {measured(control.before)}")
    say(f"  after:  {measured(control.after)}")
    latency = control.latency_ms
    if latency:
        say(f"  latency on lpt's backend, one sample: {latency['before']:.3f} ms before, {latency['after']:.3f} ms "
            f"after (×{latency['after'] / latency['before']:.2f})")
    say(f"  search: {len(control.trials)} trial{'s' if len(control.trials) != 1 else ''} in {control.seconds:.1f} s"
        + (f"; stopped: {control.stopped}" if control.stopped else ""))


@main.command("compare")
@click.argument("reference", type=click.Path())
@click.argument("candidate", type=click.Path())
@click.option("--data", type=click.Path(), required=True,
              help="Inputs (.npz keyed by input name, .npy, or a folder of them); labels may sit in the same .npz. "
                   "Or a folder of images or audio (options below; class subfolders give labels), preprocessed as "
                   "CANDIDATE records when no option is given.")
@click.option("--labels", "labels_key", help="The key of the labels in DATA (gives top-1 accuracy of both, and "
              "top-5 with five classes or more); for a folder without class subfolders, a CSV file,label. "
              "E.g. --labels labels, --labels photos.csv")
@click.option("--backend", type=click.Choice(["lpt", "onnxruntime"]), default="lpt", show_default=True,
              help="What runs CANDIDATE: lpt's int8 backend, or onnxruntime (its own int8 kernels).")
@click.option("--per-layer", is_flag=True, help="SQNR per layer, worst first, tensors matched by name.")
@click.option("--emulate", type=click.Choice(["avx2"]), help="Run CANDIDATE on lpt's backend as an AVX2 CPU without "
              "VNNI computes it: onnxruntime's u8×s8 kernels there saturate pairs of products in int16. Says per layer "
              "how many output channels saturated on DATA and what it cost in SQNR. E.g. --emulate avx2")
@click.option("--json", "json_path", type=click.Path(), help="Write the comparison as JSON here.")
@click.option("--plot", type=click.Path(), help="Draw the per-layer SQNR as a PNG bar chart.")
@click.option("--force", is_flag=True, help="Replace existing --json/--plot files.")
@batch_axis_option
@ray_options
@_one_line_errors
@data_options
def compare_command(reference, candidate, data, labels_key, backend, per_layer, emulate, json_path, plot, force,
                    batch_axes, data_options: DataOptions, files: paths.Files, ray: str | None = None,
                    ray_workers: int | None = None) -> None:
    """Compare CANDIDATE (an FQ or int8 model) with REFERENCE (usually the fp32 model).

    Per output: SQNR, cosine similarity, max and mean absolute error; with --labels, top-1
    accuracy of both and the drop; without, how often their top-1 agree. --per-layer finds
    where the error comes from.

    \b
    Example:
      lpt compare models/digits_cnn.onnx models/digits_cnn.ort_qdq.onnx \\
          --data models/digits_cnn.test.npz --labels labels --per-layer
      lpt compare resnet.onnx resnet.fq.onnx --data val/     val/CLASS/*.jpg, preprocessed as at calibration
      lpt compare resnet.onnx resnet.fq.onnx --data val/ --ray ray://head:10001      on a Ray cluster
    """
    axes = parse_batch_axes(batch_axes)
    reference = files.model(reference, "the reference model")
    candidate = files.model(candidate, "the candidate model")
    data = files.data(data)
    data = open_folder(data, [candidate, reference], data_options, labels=labels_key, batch_axes=axes)
    json_path = files.output(json_path, "--json", force=force)
    plot = files.output(plot, "--plot", force=force)
    comparison = lpt.compare(reference, candidate, data, labels=labels_key, backend=backend,
                             per_layer=per_layer or plot is not None, batch_axes=axes, emulate=emulate,
                             ray=ray, ray_workers=ray_workers)
    say_skipped(data)
    result = comparison.to_dict()
    table = Table(title=f"{candidate.name} vs {reference.name} ({backend}{', emulating ' + emulate if emulate else ''})",
                  title_justify="left")
    for column in ("output", "SQNR dB", "cosine", "max |err|", "mean |err|"):
        table.add_column(column)
    for name, a in comparison.outputs.items():
        table.add_row(name, f"{a.sqnr_db:.2f}", f"{a.cosine:.6f}", f"{a.max_abs_error:.4g}", f"{a.mean_abs_error:.4g}")
    console.print(table)
    if "accuracy" in result:
        acc = result["accuracy"]
        say(f"top-1: reference {acc['reference']:.2%}, candidate {acc['candidate']:.2%}, "
                      f"drop {100 * acc['drop']:.2f} pt")
        if "top5" in acc:
            top5 = acc["top5"]
            say(f"top-5: reference {top5['reference']:.2%}, candidate {top5['candidate']:.2%}, "
                f"drop {100 * top5['drop']:.2f} pt")
    elif "agreement" in result:
        say(f"top-1 agreement: {result['agreement']:.2%}")
    if emulate is not None:
        _print_saturation(comparison.saturation, emulate)
    if comparison.layers:
        layers = Table(title="per quantized tensor, worst quantization first", title_justify="left")
        for column in ("tensor", "op", "SQNR of its quantization dB", "accumulated SQNR dB", "computed in"):
            layers.add_column(column)
        for layer in comparison.layers:
            layers.add_row(layer.name, layer.op, f"{layer.sqnr_db:.2f}", f"{layer.accumulated_sqnr_db:.2f}",
                           layer.precision,
                           style="yellow" if layer.precision == "f32" else None)
        console.print(layers)
    if json_path is not None:
        lpt.model_io.write_bytes(json.dumps(result, indent=2).encode(), json_path, overwrite=force)
    if plot is not None:
        lpt.model_io.write_bytes(_plot_layers(comparison), plot, overwrite=force)
        click.echo(shown(f"wrote {plot}"))


@main.command()
@click.argument("model", type=click.Path())
@click.option("--data", type=click.Path(), help="Inputs; the first sample is timed. Default: MODEL's "
              ".npz beside it.")
@click.option("--fp32", "fp32_path", type=click.Path(), help="The fp32 model, timed in onnxruntime "
              "as the baseline of the ratios.")
@click.option("--threads", default=2, show_default=True, help="Threads for every engine (lpt's integer GEMM, "
              "BLAS and onnxruntime; at most one per core).")
@click.option("--repeats", default=20, show_default=True, help="Timed runs per engine; the median is reported.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@_one_line_errors
def bench(model: str, data, fp32_path, threads: int, repeats: int, as_json: bool, files: paths.Files) -> None:
    """Time lpt's int8 backend against onnxruntime on a fake-quantized MODEL (batch of one sample).

    Reports median latency of lpt's int8 plan, of onnxruntime on the QDQ model (its own int8
    kernels) and, with --fp32, of onnxruntime on the fp32 model, as ratios, plus where lpt's
    time goes. bench/resnet18.py runs the same on a ResNet-18-shaped model.

    \b
    Example:
      lpt bench models/digits_cnn.ort_qdq.onnx --data models/digits_cnn.npz --fp32 models/digits_cnn.onnx
    """
    from lpt.benchmark import benchmark, machine_line
    from lpt.calibration.data import CalibrationData, input_specs

    threads = bounded_threads("--threads", threads, 1)
    at_least("--repeats", repeats, 1)
    model = files.model(model)
    data = files.data(_default_data(model, data))
    if fp32_path is not None:
        fp32_path = files.model(fp32_path, "the fp32 model")
    fq = lpt.load(model)
    dataset = CalibrationData(data, input_specs(fq), subset_size=1, batch_size=1)
    feeds = next(iter(dataset.batches()))
    fp32 = lpt.read_model(fp32_path) if fp32_path is not None else None
    result = benchmark(fq, feeds, fp32_model=fp32, threads=threads, repeats=repeats)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    ratios = result.ratios()
    click.echo(machine_line(result.machine))
    table = Table(title=f"median of {repeats} runs, {threads} threads", title_justify="left")
    for column in ("engine", "ms", "× onnxruntime fp32"):
        table.add_column(column)
    for engine, ms in result.median_ms.items():
        table.add_row(engine, f"{ms:.3f}", f"{ratios[engine]:.2f}" if ratios else "-")
    console.print(table)
    click.echo(shown("lpt's slowest steps: " + "; ".join(f"{step} {ms:.3f} ms" for step, ms in result.profile[:5])))


def _print_saturation(saturation, emulate: str) -> None:
    """Per emulated int8 layer: the channels whose int16 pair sums saturated on the data, and the cost."""
    table = Table(title=f"int16 pair saturation ({emulate}), per int8 layer", title_justify="left")
    for column in ("layer", "op", "channels saturated", "moved > 1 LSB", "sums saturated", "SQNR vs exact dB"):
        table.add_column(column)
    for s in saturation:
        table.add_row(s.name, s.op, f"{s.saturated_channels}/{s.channels}", str(s.changed_channels),
                      f"{s.saturated_share:.3%}", f"{s.sqnr_db:.2f}", style="yellow" if s.changed_channels else None)
    console.print(table)


def _plot_layers(comparison) -> bytes:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise lpt.LptError("--plot needs matplotlib: pip install 'lpt[plot]'") from None
    import io

    layers = comparison.layers
    figure, axes = plt.subplots(figsize=(8, 0.3 * len(layers) + 1.5))
    colors = ["tab:orange" if l.precision == "f32" else "tab:blue" for l in layers]
    axes.barh([l.name for l in layers], [l.sqnr_db for l in layers], color=colors)
    axes.invert_yaxis()
    axes.set_xlabel("SQNR of each tensor's quantization vs the reference (dB); orange: computed in f32")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return buffer.getvalue()


def _register_calibrate() -> None:
    from cli.calibrate import calibrate

    calibrate.callback = _one_line_errors(calibrate.callback)
    main.add_command(calibrate)


_register_calibrate()


def _add_max_memory() -> None:
    """--max-memory on every command: each reads a model, and a model's shapes can ask for any size."""
    for command in main.commands.values():
        command.params.append(click.Option(
            ["--max-memory"], metavar="SIZE",
            help="Refuse a model whose shapes ask for a tensor larger than SIZE, before allocating it (e.g. "
                 "4GB; binary units). Default: 2GB, or half this machine's memory if less."))


_add_max_memory()

if __name__ == "__main__":
    main()
