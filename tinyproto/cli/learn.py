"""`tinyproto learn`: the click command over tinyproto.pipeline.learn (heavy imports stay inside). Layer: cli."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tinyproto.core.errors import TinyprotoError
from tinyproto.cli.options import label_option, not_blank, MODEL_DIR, baud_option, upload_port_option


def _yes(flag: bool) -> str:
    return "[green]yes[/green]" if flag else "[red]NO[/red]"


def print_learn_report(console, s: dict, model_dir: Path) -> None:
    from rich.table import Table

    test, sram, eeprom = s["test"], s["sram"], s["eeprom"]
    table = Table(title=f"on-device learning of {model_dir} on {s['target']}", show_header=False)
    table.add_row("samples sent", f"{s['n_samples']} ({s['data']} training split, int8)")
    table.add_row("counts identical to the host", _yes(s["counts_identical"])
                  + ("" if s["counts_identical"] else f" ({s['count_entries_differing']} entries differ)"))
    table.add_row("bytes of counts", f"{s['count_bytes']} ({sram['counts']})")
    table.add_row("learning step", "not measured" if s["learn_cycles_mean"] is None
                  else f"{s['learn_cycles_mean']:.0f} cycles = {s['learn_ms_mean']:.2f} ms per sample")
    table.add_row("SRAM used", f"{sram['used_bytes']} of {sram['board_sram_bytes']} B (static {sram['static_bytes']} "
                  f"+ stack peak {sram['stack_peak_bytes']}; estimate before build {sram['sram_estimate_bytes']} B "
                  f"with {sram['reserved_bytes']} B reserve)")
    if eeprom["saved"]:
        table.add_row("EEPROM bytes written", f"{eeprom['bytes_written']} of a {eeprom['record_bytes']} B record "
                      f"(only changed bytes; EEPROM {eeprom['eeprom_bytes']} B)")
        table.add_row("EEPROM reload after restart", _yes(eeprom["reloaded_identical"]))
    else:
        table.add_row("EEPROM bytes written", f"0 (not saved; the record would be {eeprom['record_bytes']} B)")
    table.add_row("test vectors on the learned counts",
                  f"{test['n_vectors']}: score vectors identical {100 * test['score_agreement']:.2f} %, "
                  f"labels {100 * test['label_agreement']:.2f} %")
    compiled = test.get("compiled_model_accuracy")
    table.add_row("device accuracy after learning", f"{100 * test['device_accuracy']:.2f} %"
                  + (f" (compiled model {100 * compiled:.2f} %)" if compiled is not None else ""))
    table.add_row("learned model", f"{model_dir / s['learned_model_dir']} ({s['learned_model_hash']})")
    console.print(table)
    console.print(f"wrote [b]{model_dir / 'learn.json'}[/b]; check the learned model with "
                  f"[b]tinyproto validate {model_dir / s['learned_model_dir']}[/b]")


@click.command("learn")
@click.argument("model_dir", type=MODEL_DIR)
@click.option("--data", default=None, callback=not_blank,
              help="Data to learn (built-in name, CSV or .npz with the model's features); its training split is "
                   "streamed. Default: the built-in data set the model was compiled on.")
@label_option
@click.option("--sim", is_flag=True, help="Use the simulated Uno (the default when no --port is given).")
@click.option("--port", default=None, callback=not_blank,
              help="Serial port of a real Uno (flashed with the learning firmware first).")
@upload_port_option
@click.option("--no-flash", is_flag=True, help="With --port: the board already runs the learning firmware.")
@click.option("--save-eeprom", is_flag=True,
              help="Persist the learned counts in EEPROM (only changed bytes are written) and check they reload "
                   "after a restart.")
@click.option("--json", "as_json", is_flag=True, help="Print learn.json instead of the table.")
@baud_option
def learn_command(model_dir: Path, data: str | None, label: str | None, sim: bool, port: str | None,
                  upload_port: str | None, no_flash: bool, save_eeprom: bool, as_json: bool, baud: int | None) -> None:
    """FlyNN learns on the device: build the learning firmware, stream DATA's training samples to it, read its
    counts back and compare them with the host's, check its predictions, write MODEL_DIR/learned/ and learn.json.

    Exits non-zero if the device's counts or score vectors differ from the host's.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tinyproto.pipeline.learn import LearnOptions, learn_on_device

    if (port or upload_port) and sim:
        raise TinyprotoError("give either --port (a real board) or --sim, not both")
    if no_flash and not port:  # the simulated Uno always starts from the learning firmware it is given
        raise TinyprotoError("--no-flash is for a real board (--port) that already runs the learning firmware")
    err = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=as_json) as progress:

        def factory(what: str, total: int):
            task = progress.add_task(what, total=total)
            return lambda n: progress.advance(task, n)

        options = LearnOptions(data, port, upload_port, baud, label, save_eeprom, flash=not no_flash)
        summary = learn_on_device(model_dir, options, progress_factory=factory,
                                  say=lambda m: progress.console.print(f"[dim]· {m}[/dim]"))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        print_learn_report(Console(), summary, model_dir)
    test = summary["test"]
    if not summary["counts_identical"] or test["score_agreement"] < 1.0 or test["label_agreement"] < 1.0:
        raise TinyprotoError(f"the device did not learn what the host computes (details in {model_dir / 'learn.json'})")
    if summary["eeprom"].get("reloaded_identical") is False:
        raise TinyprotoError("the counts reloaded from EEPROM differ from the saved ones")
    if summary.get("device_figure_problems"):
        problems = "; ".join(summary["device_figure_problems"])
        raise TinyprotoError(f"the device's figures are not measurements: {problems} (details in "
                             f"{model_dir / 'learn.json'})")
