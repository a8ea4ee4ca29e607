"""`lpt`: the command line. Every command only parses arguments, calls the library and formats."""

from __future__ import annotations

import functools
import json
import logging
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

import lpt

console = Console()


def _one_line_errors(command):
    """Turn lpt's errors (and anything unexpected) into one line on stderr and exit code 1."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        debug = click.get_current_context().find_root().params.get("debug")
        try:
            return command(*args, **kwargs)
        except lpt.LptError as err:
            click.echo(f"error: {err}", err=True)
        except Exception as err:  # noqa: BLE001 - the CLI promises no tracebacks
            if debug:
                raise
            click.echo(f"error: {type(err).__name__}: {err} (rerun with --debug for the traceback)", err=True)
        sys.exit(1)

    return wrapper


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
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead of tables.")
@_one_line_errors
def inspect(model: Path, as_json: bool) -> None:
    """Show MODEL's ops, its fake-quantized tensors, and heavy ops left in float.

    Any FakeQuantize-equivalent form is recognized: QuantizeLinear/DequantizeLinear pairs,
    OpenVINO's FakeQuantize, arithmetic chains, QLinearConv/QLinearMatMul, ConvInteger.

    \b
    Example:
      lpt inspect models/digits_cnn.ort_qdq.onnx
      lpt inspect models/digits_cnn.ort_qdq.onnx --json > summary.json
    """
    summary = lpt.summarize(lpt.load(model))
    if as_json:
        click.echo(json.dumps(summary.to_dict(), indent=2))
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
        console.print("every Conv/ConvTranspose/MatMul/Gemm reads fake-quantized inputs")


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


def _refuse_input_as_output(model: Path, output: Path) -> None:
    if output.exists() and output.resolve() == model.resolve():
        raise lpt.ModelError(f"{output}: refusing to overwrite the input model")


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Where to write the int8 graph.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists (never the input).")
@click.option("--quiet", is_flag=True, help="Print only where the graph was written.")
@_one_line_errors
def transform(model: Path, output: Path, force: bool, quiet: bool) -> None:
    """Run the low precision transformations on a fake-quantized MODEL and save the int8 graph.

    FakeQuantizes split into quantize + dequantize, dequantizations move down the graph,
    weights become int8 constants, and Conv/MatMul/Gemm run as ConvInteger/MatMulInteger.
    The table says which ops run on integers and why the others stay f32.

    \b
    Example:
      lpt transform models/digits_cnn.ort_qdq.onnx -o digits_int8.onnx
    """
    _refuse_input_as_output(model, output)
    m = lpt.load(model)
    lpt.transform(m)
    lpt.save(m, output, overwrite=force)
    if not quiet:
        _print_precisions(lpt.op_precisions(m))
    click.echo(f"wrote {output}")


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Where to write the model.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists (never the input).")
@_one_line_errors
def normalize(model: Path, output: Path, force: bool) -> None:
    """Load MODEL, normalize its FakeQuantize forms, and save it as standard ONNX.

    QDQ-semantics fake quantization is written as QuantizeLinear/DequantizeLinear (bit-exact),
    everything else as OpenVINO's FakeQuantize op.

    \b
    Example:
      lpt normalize models/digits_cnn.ort_qdq.onnx -o digits_normalized.onnx
    """
    _refuse_input_as_output(model, output)
    normalized = lpt.load(model)
    lpt.save(normalized, output, overwrite=force)
    click.echo(f"wrote {output}")


def _default_data(model: Path, data: Path | None, suffix: str = ".npz") -> Path:
    """--data, or the .npz that sits beside the model (as in models/)."""
    if data is not None:
        return data
    beside = model.with_suffix(suffix)
    if beside.exists():
        return beside
    raise lpt.DataError(f"no --data given and no {beside.name} beside {model.name}: pass --data with an .npz keyed "
                        "by input name, an .npy (single-input models) or a folder of them")


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--data", type=click.Path(path_type=Path), help="Inputs: .npz keyed by input name, .npy, or a folder "
              "of them. Default: MODEL's .npz beside it.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the outputs here (.npz keyed by output name).")
@click.option("--check", is_flag=True, help="Cross-check against onnxruntime on the FQ model and on lpt's export.")
@click.option("--batch-size", default=32, show_default=True, help="Samples per run of the plan.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists.")
@_one_line_errors
def run(model: Path, data: Path | None, output: Path | None, check: bool, batch_size: int, force: bool) -> None:
    """Run MODEL on lpt's int8 backend.

    MODEL is a fake-quantized model (transformed on the fly) or an int8 graph saved by
    `lpt transform`. Prints how many ops ran on int8 kernels and which fell back to
    onnxruntime; with --check, how far lpt is from onnxruntime, in LSBs per quantized tensor.

    \b
    Example:
      lpt run models/digits_cnn.ort_qdq.onnx --data models/digits_cnn.test.npz -o out.npz --check
    """
    result = lpt.run(model, _default_data(model, data), batch_size=batch_size, check=check)
    if output is not None:
        lpt.model_io.write_arrays(result.outputs, output, overwrite=force)
    split = ", ".join(f"{n} on {backend}" for backend, n in result.op_split.items())
    fallback = ", ".join(f"{op}×{n}" for op, n in result.plan.fallback_ops().items()) or "none"
    samples = len(next(iter(result.outputs.values())))
    click.echo(f"{samples} samples in {result.seconds:.3f} s; ops: {split}; not on int8 kernels: {fallback}")
    if result.check is not None:
        _print_check(result.check)
    if output is not None:
        click.echo(f"wrote {output}")


def _print_check(check) -> None:
    table = Table(title=f"lpt vs the FQ model: max {check.max_lsb} LSB, "
                        f"{check.share_exact:.2%} exactly equal", title_justify="left")
    for column in ("quantized tensor", "max LSB", "exactly equal", "values"):
        table.add_column(column)
    for t in check.tensors:
        table.add_row(t.tensor, str(t.max_lsb), f"{t.share_exact:.2%}", str(t.size))
    console.print(table)
    outputs = Table(title="outputs (f32)", title_justify="left")
    for column in ("output", "against", "max |diff|", "exactly equal"):
        outputs.add_column(column)
    for o in check.outputs:
        outputs.add_row(o.output, o.against, f"{o.max_abs_diff:.3g}", f"{o.share_equal:.2%}")
    console.print(outputs)
    for note in check.export_notes:
        console.print(f"  export: {note}")


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Where to write the ONNX int8 model.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists (never the input).")
@_one_line_errors
def export(model: Path, output: Path, force: bool) -> None:
    """Export MODEL (fake-quantized or lpt int8) as standard ONNX int8 that onnxruntime runs.

    Integer Conv/MatMul chains become QLinearConv/QLinearMatMul where ONNX has the form
    (ConvInteger/MatMulInteger otherwise); the rounding differences this brings are listed.

    \b
    Example:
      lpt export models/digits_cnn.ort_qdq.onnx -o digits_int8_ort.onnx
    """
    _refuse_input_as_output(model, output)
    m = lpt.load(model)
    lpt.transform(m)
    exported, report = lpt.export_int8(m)
    lpt.model_io.write_model(exported, output, overwrite=force)
    click.echo(f"{len(report.fused)} QLinear ops; {len(report.approximated)} places round differently than lpt")
    click.echo(f"wrote {output}")


if __name__ == "__main__":
    main()
