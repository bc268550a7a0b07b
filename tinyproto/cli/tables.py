"""Readable summaries (rich tables) of report.json and validation.json. Layer: cli."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def _ring_text(ring) -> str:
    """The serial receive ring's part of the SRAM line (a report.json older than the sized ring has none)."""
    if not isinstance(ring, int):
        return ""
    return f"receive ring {ring}, " if ring else "no receive ring, "


def print_compile_report(console: Console, report: dict, out_dir: Path) -> None:
    hp = Table(title=f"{report['model']} on {report['dataset']} (seed {report['seed']})", show_header=False)
    for key, value in report["hyperparameters"].items():
        hp.add_row(key, str(value))
    hp.add_row("search time", f"{report['train_seconds']} s ({len(report['solver']['candidates'])} candidates)")
    console.print(hp)

    ledger = Table(title=f"flash ledger: {report['model_bytes']} of {report['budget_bytes']} B budget")
    ledger.add_column("array")
    ledger.add_column("type")
    ledger.add_column("count", justify="right")
    ledger.add_column("bytes", justify="right")
    ledger.add_column("what")
    for name, entry in report["ledger"]["arrays"].items():
        ledger.add_row(name, entry["ctype"], str(entry["count"]), str(entry["bytes"]), entry["what"])
    ledger.add_row("[b]total[/b]", "", "", f"[b]{report['model_bytes']}[/b]", "every byte the model puts in flash")
    console.print(ledger)

    sram = report["sram_estimate"]
    summary = Table(title="accuracy and cost", show_header=False)
    summary.add_row("test vectors", str(report["n_test"]))
    summary.add_row("float accuracy", _pct(report["float_accuracy"]))
    summary.add_row("int8 accuracy (host reference)", _pct(report["int8_accuracy"]))
    summary.add_row("int8 / float agreement", _pct(report["int8_float_agreement"]))
    for name, text in confidence_rows(report.get("confidence")):
        summary.add_row(name, text)
    summary.add_row("SRAM (estimate before build)",
                    f"{sram['estimated_total_bytes']} of {sram['board_sram_bytes']} B "
                    f"(buffers {sram['working_bytes']}, serial {sram['serial_frame_bytes']}, "
                    f"{_ring_text(sram.get('rx_ring_bytes'))}reserve {sram['reserved_bytes']})")
    beside = report.get("beside_sketch")
    if isinstance(beside, dict):
        lib = beside["library"]
        summary.add_row("beside your sketch",
                        f"flash {lib['flash_bytes']} B, {beside['flash_left_bytes']} B to spare beside "
                        f"--reserve-flash {beside['reserve_flash_bytes']}; SRAM {lib['sram_bytes']} B (static "
                        f"{lib['static_sram_bytes']}, stack at most {lib['stack_bound_bytes']}, your buffers "
                        f"{lib['caller_bytes']}), {beside['sram_left_bytes']} B to spare beside --reserve-sram "
                        f"{beside['reserve_sram_bytes']} (measured by building the model's library)")
    cycles = report["predicted_cycles"]
    summary.add_row("predicted cycles / inference",
                    f"{cycles['total']} ({report['predicted_latency_ms']:.2f} ms at "
                    f"{_board_mhz(report.get('board', 'uno')):g} MHz; lower bound {cycles['lower_bound']})")
    energy = _predicted_energy(report)
    if energy:
        summary.add_row("predicted energy / inference", energy)
    console.print(summary)
    _print_runners_up(console, report)
    _print_auto(console, report)
    for warning in report["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {warning}")
    console.print(f"wrote [b]{out_dir}[/b] (model.json, report.json, test_vectors.npz, C sources, platformio.ini)")


def _board_mhz(name: str) -> float:
    from tinyproto.core.boards import load_board

    try:
        return load_board(name).f_cpu_hz / 1e6
    except Exception:  # a report of a board file that no longer exists: the Uno's clock, as before
        return 16.0


def _predicted_energy(report: dict) -> str | None:
    """V x I_active x predicted latency with the board file's currents (before any build), or None for a report
    of a board file that no longer exists."""
    from tinyproto.core.boards import load_board

    try:
        board = load_board(report.get("board", "uno"))
    except Exception:
        return None
    seconds = report["predicted_latency_ms"] / 1000.0
    return (f"{board.energy_mj(seconds, board.board_active_current_ma):.4f} mJ board, "
            f"{board.energy_mj(seconds, board.mcu_active_current_ma):.4f} mJ MCU "
            f"({board.voltage_v:g} V x active current x predicted latency)")


def _print_runners_up(console: Console, report: dict) -> None:
    """The chosen shape beside the next best candidates: validation accuracy, bytes, predicted ms."""
    runners = report.get("runners_up") or []
    if not runners:
        return
    limit = report.get("max_latency_ms")
    title = "chosen shape and runners-up" + (f" (--max-latency {limit:g} ms)" if limit is not None else "")
    table = Table(title=title)
    for column, justify in (("", "left"), ("shape", "left"), ("val int8 acc.", "right"), ("bytes", "right"),
                            ("predicted ms", "right")):
        table.add_column(column, justify=justify)
    from tinyproto import families

    shape_text = families.family(report["model"]).shape_text
    chosen = report["solver"].get("chosen_validation")
    if chosen:
        table.add_row("[b]chosen[/b]", shape_text(chosen), _pct(chosen["val_int8_accuracy"]),
                      str(chosen["model_bytes"]), f"{chosen['predicted_latency_ms']:.3f}")
    for i, entry in enumerate(runners, start=1):
        table.add_row(str(i), shape_text(entry), _pct(entry["val_int8_accuracy"]), str(entry["model_bytes"]),
                      f"{entry['predicted_latency_ms']:.3f}")
    console.print(table)
    selection = report["solver"].get("selection")
    if selection:
        console.print(f"[dim]chosen: {selection} (the chosen row is the validation model; the shipped model is "
                      f"refit on all training data: {report['predicted_latency_ms']:.3f} ms predicted)[/dim]")


def _print_auto(console: Console, report: dict) -> None:
    """--model auto: every family's validated int8 accuracy within the budget, or why it was refused."""
    auto = report.get("auto")
    if not auto:
        return
    table = Table(title="--model auto: every family under the same budget")
    for column, justify in (("family", "left"), ("val int8 acc.", "right"), ("bytes", "right"),
                            ("predicted cycles", "right")):
        table.add_column(column, justify=justify)
    for row in auto["families"]:
        name = f"[b]{row['family']}[/b]" if row["family"] == auto["chosen"] else row["family"]
        if "refused" in row:
            table.add_row(name, "refused", "", "")
        else:
            table.add_row(name, _pct(row["val_int8_accuracy"]), str(row["model_bytes"]), str(row["predicted_cycles"]))
    console.print(table)
    # a refusal is a sentence: whole, under the table (cut to a column it lost its point)
    for row in auto["families"]:
        if "refused" in row:
            console.print(f"[dim]{row['family']} refused: {escape(row['refused'])}[/dim]")
    console.print(f"[dim]chosen: {auto['chosen']} ({auto['selection']})[/dim]")


def confidence_rows(figures: dict | None, on_device: bool = False) -> list[tuple[str, str]]:
    """The confidence figures of report.json / validation.json as table rows (none for an older file)."""
    if not figures or figures.get("coverage") is None:
        return []
    where = "device" if on_device else "test split"
    rows = [(f"confidence ({where})", f"mean {_pct(figures['mean_confidence'])}, calibration error "
                                      f"{100 * figures['ece']:.1f} points ({figures['ece_bins']} bins)"),
            ("answered (not unknown)", f"{_pct(figures['coverage'])} of known-class rows, "
                                       f"{_pct(figures['accepted_accuracy'] or 0.0)} of them right")]
    held = figures.get("held_out")
    if held:
        auroc = "-" if held["auroc"] is None else f"{held['auroc']:.3f}"
        rows.append(("held-out classes", f"{held['rows']} rows: novelty AUROC {auroc}, "
                                         f"{_pct(held['declined'])} answered unknown"))
    return rows


def print_validation_report(console: Console, v: dict, model_dir: Path) -> None:
    table = Table(title=f"validation of {model_dir} on {v['target']} ({v['board']})", show_header=False)
    failed = [name for name, check in v["checks"].items() if check["ok"] is False]
    skipped = [name for name, check in v["checks"].items() if check["ok"] is None]
    passed = ("every check passed" if not skipped else
              f"every check run passed; not checked: {', '.join(skipped)}")  # never claim what was skipped
    verdict = (f"[green]device == host reference, bit-exact; {passed}[/green]" if v["passed"]
               else f"[red]FAILED: {', '.join(failed)}[/red]")
    table.add_row("verdict", verdict)
    for name, check in v["checks"].items():
        mark = {True: "[green]ok[/green]", False: "[red]FAILED[/red]", None: "[dim]skipped[/dim]"}[check["ok"]]
        table.add_row(f"check: {name}", f"{mark} {check['detail']}")
    table.add_row("vectors", f"{v['n_vectors']}{'' if v['complete'] else ' (incomplete)'}")
    table.add_row("score vectors identical", _pct(v["score_agreement"]))
    table.add_row("labels identical", _pct(v["label_agreement"]))
    table.add_row("device accuracy", f"{_pct(v['device_accuracy'])} (host int8 {_pct(v['host_accuracy'])})")
    for name, text in confidence_rows(v.get("confidence"), on_device=True):
        table.add_row(name, text)
    table.add_row("cycles / inference", f"mean {v['cycles_mean']:.0f}, min {v['cycles_min']}, max {v['cycles_max']}")
    mhz = f"{v.get('f_cpu_hz', 16_000_000) / 1e6:g} MHz"
    table.add_row("latency", f"{v['latency_ms_mean']:.3f} ms at {mhz}" if v["latency_ms_mean"] is not None
                  else f"not measured (the cycle counts are not plausible) at {mhz}")
    err = v["predicted_error"]
    table.add_row("cost model", f"predicted {v['predicted_cycles']:.0f} cycles ({100 * err:+.1f} %)"
                  if err is not None else "-")
    if v["measured_over_bound"] is not None:
        table.add_row("vs MAC lower bound", f"{v['measured_over_bound']:.2f}x of {v['lower_bound_cycles']} cycles")
    if v["energy_mj_mcu"] is not None:
        table.add_row("energy / inference (model)",
                      f"MCU {v['energy_mj_mcu']:.4f} mJ, board {v['energy_mj_board']:.4f} mJ")
    table.add_row("flash", f"{v['flash_bytes']} of {v['flash_available_bytes']} B "
                  f"(model {v['model_bytes']} B, budget {v['budget_bytes']} B)")
    stack = v["stack_peak_bytes"]
    table.add_row("SRAM", f"static {v['sram_static_bytes']} B + stack peak {stack} B, "
                  f"margin {v['sram_margin_bytes']} B of {v.get('sram_bytes', 2048)}")
    markers = v.get("simulator_marker_cycles")
    if markers and markers["n_compared"]:
        table.add_row("simulator markers", f"GPIOR0 spans - Timer1 cycles: "
                      f"{markers['marker_minus_timer1_min']}..{markers['marker_minus_timer1_max']}")
    raw = v.get("raw_input")
    if raw:
        from tinyproto.pipeline.validate import inputs_counted

        table.add_row("on-device input stage", f"{raw['inputs_differing']} of {raw['n_inputs']} int8 inputs"
                      f"{inputs_counted(raw)} differ ({raw['inputs_differing_by_more_than_1_lsb']} by > 1 LSB); "
                      f"{raw['labels_changed']} labels change")
    line = v.get("line")
    if line:
        # seconds as "23.9s": a cell wrapped between a figure and its unit would leave the figure unreadable
        table.add_row("serial line", f"{line['baud']} baud: {line['bytes_to_device']} B to / "
                      f"{line['bytes_from_device']} B from the device; "
                      f"{line['line_seconds']:.1f}s on the line alone, measured "
                      f"{line['measured_seconds']:.1f}s")  # the ratio, which moves from run to run: validation.json
    console.print(table)
    console.print(f"[dim]{v['energy_note']}[/dim]")
    for m in v["mismatches"]:
        console.print(f"[red]vector {m['vector']}[/red]: device {m['device_label']} {m['device_scores']} "
                      f"/ host {m['host_label']} {m['host_scores']}")
