"""`tinyproto export`: the model of a directory as an Arduino library, or several models for one sketch.
Layer: cli."""

from __future__ import annotations

from pathlib import Path

import click

from tinyproto.cli.options import MODEL_DIR, TextPath, prefix_option, shown


@click.command("export")
@click.argument("model_dirs", nargs=-1, required=True, type=MODEL_DIR, metavar="MODEL_DIR...")
@click.option("--arduino", "arduino", is_flag=True, default=True,
              help="Export as an Arduino library (the default, and so far the only format).")
@click.option("--out", type=TextPath(path_type=Path), default=None,
              help="Directory to write (default: <MODEL_DIR>-arduino; for several models, models-arduino beside "
                   "the first): the libraries and their .zip files. Replaced only if tinyproto wrote it and nobody "
                   "changed it.")
@click.option("--name", default=None,
              help="Library name, a C identifier (default: from the data set, e.g. digits -> TinyprotoDigits). One "
                   "model only.")
@prefix_option
def export_command(model_dirs: tuple[Path, ...], arduino: bool, out: Path | None, name: str | None,
                   prefix: str | None) -> None:
    """Export the model of MODEL_DIR for use in your own code; several MODEL_DIRs for one sketch.

    \b
    --arduino (the default) writes an Arduino library: library.properties, src/ (the model header, the runtime and
    <Name>.h, the documented C API), examples/<Name>/<Name>.ino (one vector per Serial line in, the class
    and its score out), plus <Name>.zip for the Arduino IDE's Sketch > Include Library > Add .ZIP Library.
    With several MODEL_DIRs: one library per model (each under the C prefix it was compiled with, so they link
    together), and an example sketch Models/Models.ino that runs any of them.
    """
    from tinyproto.pipeline.arduino import export_arduino, export_arduino_models

    if len(model_dirs) > 1:
        if name is not None or prefix is not None:
            raise click.UsageError("--name and --prefix are for one model; several models keep the prefixes they "
                                   "were compiled with (tinyproto compile --prefix)")
        result = export_arduino_models(list(model_dirs), out)
        for library in result.libraries:
            click.echo(f"wrote Arduino library {library.name}: {shown(library.library_dir)}")
        click.echo(f"  example sketch with every model: {shown(result.sketch)}")
        click.echo(f"  PlatformIO project of the sketch: {shown(result.out_dir / 'platformio.ini')}")
        return
    result = export_arduino(model_dirs[0], out, name, prefix)
    click.echo(f"wrote Arduino library {result.name}: {shown(result.library_dir)}")
    click.echo(f"  zip for the Arduino IDE (Add .ZIP Library): {shown(result.zip_path)}")
    click.echo(f"  example sketch: {shown(result.library_dir / 'examples' / result.name / (result.name + '.ino'))}")
