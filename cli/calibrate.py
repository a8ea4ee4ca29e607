"""`lpt calibrate`: parse options, call lpt.calibration.calibrate, save, print a summary.

This module raises lpt's errors (DataError, ModelError, QuantizationError) and leaves them to
the one-line error handler of cli/main.py, which also passes the lpt.paths.Files that watches
the command's files; to register it there:

    from cli.calibrate import calibrate
    calibrate.callback = _one_line_errors(calibrate.callback)
    main.add_command(calibrate)
"""

from __future__ import annotations

from pathlib import Path

import click

import lpt
from cli.data_options import DataOptions, data_options, open_folder, say_skipped
from cli.shared import Table, at_least, console, say
from lpt.calibration import DEFAULT_ESTIMATOR, DEFAULT_OVERFLOW_FIX, DEFAULT_PRESET, Estimator, OverflowFix, Preset
from lpt.calibration import calibrate as run_calibration
from lpt.calibration.data import data_beside, parse_batch_axes
from lpt.errors import shown
from lpt.paths import Files


def batch_axis_option(command):
    """--batch-axis NAME=AXIS, repeatable (calibrate, quantize, run, compare): parsed in the command by
    lpt.calibration.data.parse_batch_axes, so a bad value is a one-line DataError."""
    return click.option("--batch-axis", "batch_axes", multiple=True, metavar="NAME=AXIS",
                        help="Which axis of DATA holds input NAME's samples, or none for a fixed input fed "
                             "whole with every batch (e.g. state=1 for a [2, N, 128] state, sr=none). Default: "
                             "guessed from the model's input shapes. Repeatable.")(command)


def ray_options(command):
    """--ray [ADDRESS] and --ray-workers N (calibrate, compare, quantize): lpt.distributed."""
    command = click.option(
        "--ray-workers", type=click.IntRange(min=1), metavar="N",
        help="With --ray: how many Ray workers share the batches (default: one per CPU of the cluster). "
             "E.g. --ray-workers 8")(command)
    return click.option(
        "--ray", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
        help="Share the passes over DATA among Ray workers, each with its own session or compiled plan; "
             "statistics and metrics are merged to what one process gets. Without ADDRESS (or --ray local), Ray "
             "starts on this machine; else an existing cluster (needs pip install 'lpt[ray]'). E.g. --ray, --ray auto, "
             "--ray ray://head:10001")(command)


def overflow_fix_option(command):
    """--overflow-fix auto|none|first|all (calibrate, quantize): lpt.calibration.overflow_fix."""
    return click.option(
        "--overflow-fix", type=click.Choice([m.value for m in OverflowFix]), default=DEFAULT_OVERFLOW_FIX.value,
        show_default=True,
        help="Which weights get a coarser grid so that pairs of u8×s8 products do not saturate their int16 sum "
             "on a CPU without VNNI (onnxruntime's AVX2 kernels): auto, the output channels where saturation moved "
             "a layer's output on the data, just enough (passes over it emulating that CPU); first, the first "
             "layer on 7 bits; all, every layer on 7 bits (NNCF's overflow fix); none, keep 8 bits (e.g. a model "
             "served on VNNI CPUs only: --overflow-fix none).")(command)


def smooth_quant_option(command):
    """--smooth-quant ALPHA (calibrate, quantize): lpt.calibration.smooth_quant."""
    return click.option(
        "--smooth-quant", type=click.FloatRange(0.0, 1.0), metavar="ALPHA",
        help="SmoothQuant: before placing FQs, divide each MatMul/Gemm/Conv input channel by s = max|X|^ALPHA / "
             "max|W|^(1-ALPHA) and multiply the weight rows by s (absorbed into a LayerNorm, the producing "
             "MatMul or Conv, else an inserted Mul); the fp32 function is unchanged, activation outliers move "
             "into the weights. One more pass over the data. Default: off. E.g. --smooth-quant 0.5")(command)


def int8_recurrent_option(command):
    """--int8-recurrent (calibrate, quantize): lpt.calibration.recurrent."""
    return click.option(
        "--int8-recurrent/--no-int8-recurrent", default=None,
        help="Quantize LSTM/GRU statically, their recurrent MatMuls included: each becomes per-gate input "
             "projections (int8 MatMuls) and a Scan per direction whose h·Rᵀ reads an int8 h, its range the "
             "hidden states seen in the data. Default: those of hidden size 256 or more, where the recurrent "
             "products take the time (ddddocr's 512: -0.1 dB); smaller ones stay f32 ops. --no-int8-recurrent "
             "keeps every one f32. E.g. lpt quantize plcmos_v2.onnx --int8-recurrent")(command)


def say_recurrent(report) -> None:
    """The LSTM/GRU directions whose recurrent MatMuls run int8, one line each."""
    for r in report.recurrent:
        say(f"int8 recurrence: {r.op} ({r.op_type}) as {r.scan}, h in [{r.hidden_low:.4g}, {r.hidden_high:.4g}]")


def say_smoothed(report) -> None:
    """What SmoothQuant did, one line per smoothed activation."""
    if report.smooth_quant is None:
        return
    say(f"smooth quant (alpha {report.smooth_quant:g}): {len(report.smoothed)} activations smoothed")
    for t in report.smoothed:
        say(f"  {t['tensor']} → {', '.join(t['layers'])}: absorbed by {t['absorbed_by']}, largest channel "
            f"{t['outlier_ratio']:.1f} → {t['outlier_ratio_after']:.1f}× the median")


def say_narrowed(report) -> None:
    """The overflow fix's narrowed weights, one line each: how many channels, and the weights' SQNR cost."""
    narrowed = sum(n.narrowed for n in report.narrowed)
    say(f"overflow fix ({report.overflow_fix}): {narrowed} weight channels narrowed in {len(report.narrowed)} layers")
    for n in report.narrowed:
        say(f"  {n.weight} ({', '.join(n.layers)}): {n.narrowed}/{n.channels} channels, integers within "
            f"±{n.smallest_qmax} at the narrowest; weight SQNR {n.weight_sqnr_db:.1f} → {n.narrowed_sqnr_db:.1f} dB")


def default_output(model: Path) -> Path:
    """NAME.fq.onnx beside MODEL."""
    stem = model.name[: -len(".onnx")] if model.name.endswith(".onnx") else model.name
    return model.with_name(f"{stem}.fq.onnx")


@click.command()
@click.argument("model", type=click.Path())
@click.option("--data", type=click.Path(),
              help="Calibration samples: .npz keyed by input name, .npy (single input), or a folder of them, or "
                   "a folder of images or audio (options below; recorded in the FQ model). Default: MODEL's .npz "
                   "beside it.")
@click.option("--preset", type=click.Choice([p.value for p in Preset]), default=DEFAULT_PRESET.value,
              show_default=True, help="performance: symmetric activations; mixed: asymmetric u8 activations.")
@click.option("--estimator", type=click.Choice([e.value for e in Estimator]), default=DEFAULT_ESTIMATOR.value,
              show_default=True, help="How activation ranges come from the statistics (auto: per tensor, the "
              "candidate with the least error at the output of the layers reading it; a second pass over the data).")
@click.option("--subset-size", default=300, show_default=True,
              help="Use at most N samples.")
@batch_axis_option
@click.option("--ignore", multiple=True, metavar="NODE|re:REGEX|OP",
              help="Leave matching nodes in f32 (node name, regex on names, or op type); repeatable.")
@click.option("--no-bias-correction", is_flag=True, help="Do not shift biases by the mean quantization error.")
@overflow_fix_option
@smooth_quant_option
@int8_recurrent_option
@click.option("--skip-nonfinite", is_flag=True, help="Skip samples holding NaN/Inf instead of refusing the data.")
@click.option("--quiet", is_flag=True, help="No progress bar or summary; print only where the model was written.")
@click.option("-o", "--output", type=click.Path(), help="Where to write the FQ model. "
              "Default: MODEL_STEM.fq.onnx beside MODEL.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists (never the input).")
@ray_options
@data_options
def calibrate(model: str, data: str | None, preset: str, estimator: str, subset_size: int,
              batch_axes: tuple[str, ...], ignore: tuple[str, ...], no_bias_correction: bool, overflow_fix: str,
              smooth_quant: float | None, int8_recurrent: bool | None, skip_nonfinite: bool,
              quiet: bool, output: str | None, force: bool, ray: str | None, ray_workers: int | None,
              data_options: DataOptions, files: Files) -> None:
    """Calibrate an fp32 MODEL on sample data and insert FakeQuantize nodes (written as QDQ ONNX).

    Activations get per-tensor ranges from the statistics, weights symmetric int8 per output
    channel; biases absorb the mean error quantization adds. The summary lists the FQs
    inserted, the ops left in f32 and why.

    \b
    Example:
      lpt calibrate models/digits_cnn.onnx                  uses models/digits_cnn.npz
      lpt calibrate model.onnx --data samples/ --estimator mse --ignore re:^/head/ -o model.fq.onnx
      lpt calibrate yolo.onnx --data photos/ --preprocess yolo      JPEGs, letterboxed to the model's size
      lpt calibrate resnet.onnx --data photos/ --preprocess imagenet --ray      statistics on Ray workers
      lpt calibrate models/digits_transformer.onnx --smooth-quant 0.5
      lpt calibrate speech_gru.onnx --data samples.npz --int8-recurrent
    """
    at_least("--subset-size", subset_size, 1)
    axes = parse_batch_axes(batch_axes)
    model = files.model(model)
    data = files.data(data if data is not None else data_beside(model))
    data = open_folder(data, model, data_options, batch_axes=axes, quiet=quiet)  # a folder of images or audio
    output = files.output(default_output(model) if output is None else output,
                          "-o" if output is not None else "the default output", force=force)
    result = run_calibration(model, data, preset=preset, estimator=estimator, subset_size=subset_size,
                             ignore=ignore, bias_correction=not no_bias_correction, skip_nonfinite=skip_nonfinite,
                             quiet=quiet, batch_axes=axes, overflow_fix=overflow_fix, smooth_quant=smooth_quant,
                             int8_recurrent=int8_recurrent, ray=ray, ray_workers=ray_workers)
    lpt.save(result.model, output, overwrite=force)
    if not quiet:
        print_summary(result.report, model)
        say_skipped(data)
    click.echo(shown(f"wrote {output}"))


def print_summary(report, model: Path) -> None:
    inserted = Table(title=f"{model.name}: FakeQuantizes inserted ({report.preset} preset, {report.estimator})",
                     title_justify="left")
    inserted.add_column("kind")
    inserted.add_column("count", justify="right")
    for kind, count in report.fake_quantizes.items():
        inserted.add_row(kind, str(count))
    console.print(inserted)
    if report.left_f32:
        left = Table(title=f"left in f32 ({len(report.left_f32)})", title_justify="left")
        for column in ("node", "op", "why"):
            left.add_column(column)
        for s in report.left_f32:
            left.add_row(s.node, s.op_type, s.reason)
        console.print(left)
    skipped = f", {report.skipped_samples} skipped for NaN/Inf" if report.skipped_samples else ""
    corrected = f"; {len(report.bias_corrected)} biases corrected" if report.bias_corrected else ""
    say_narrowed(report)
    say_smoothed(report)
    say_recurrent(report)
    say(f"{report.samples} samples{skipped}{corrected}; {report.seconds:.2f} s")
