"""`tinyproto export`: the model of a directory as an Arduino library. Layer: cli."""

from __future__ import annotations

from pathlib import Path

import click

from tinyproto.cli.options import MODEL_DIR, TextPath
from tinyproto.pipeline.arduino import export_arduino


@click.command("export")
@click.argument("model_dir", type=MODEL_DIR)
@click.option("--arduino", "arduino", is_flag=True, required=True,
              help="Export as an Arduino library (the only export format so far).")
@click.option("--out", type=TextPath(path_type=Path), default=None,
              help="Directory to write (default: <MODEL_DIR>-arduino): the library folder and its .zip. "
                   "Replaced only if tinyproto wrote it and nobody changed it.")
@click.option("--name", default=None,
              help="Library name, a C identifier (default: from the data set, e.g. digits -> TinyprotoDigits).")
def export_command(model_dir: Path, arduino: bool, out: Path | None, name: str | None) -> None:
    """Export the model of MODEL_DIR for use in your own code.

    \b
    --arduino writes an Arduino library: library.properties, src/ (the model header, the runtime and
    <Name>.h, the documented C API), examples/<Name>/<Name>.ino (one vector per Serial line in, the class
    and its score out), plus <Name>.zip for the Arduino IDE's Sketch > Include Library > Add .ZIP Library.
    """
    if not arduino:
        raise click.UsageError("choose an export format: --arduino")
    result = export_arduino(model_dir, out, name)
    click.echo(f"wrote Arduino library {result.name}: {result.library_dir}")
    click.echo(f"  zip for the Arduino IDE (Add .ZIP Library): {result.zip_path}")
    click.echo(f"  example sketch: {result.library_dir / 'examples' / result.name / (result.name + '.ino')}")
