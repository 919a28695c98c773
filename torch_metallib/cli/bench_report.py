"""What `bench` shows: a plain (or Markdown) table on stdout, and with --plot a picture of
the time to first result, stacked by phase, ours against each baseline (matplotlib, an
optional extra: ``pip install matplotlib``)."""

from ..errors import TorchMetallibError

__all__ = ["table", "plot", "require_matplotlib"]


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise TorchMetallibError("bench --plot needs matplotlib, which is not installed: pip install matplotlib "
                                 "(or leave out --plot)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def _value(figure: dict, key: str) -> str:
    value = figure[key]
    return f"{value:.3f}" if figure["unit"] == "ms" else f"{value:.2f}"


def table(result: dict, markdown: bool = False) -> str:
    library = result["library"]
    versions = result["versions"]
    machine = result["machine"]
    lines = [f"{library['path']}: {library['bytes']:,} bytes, {library['functions']:,} functions; "
             f"kernels {', '.join(result['kernels'])} on {result['device']}",
             f"{result['date']}; {machine['system']} {machine['machine']}, {machine['cpus']} CPUs; python "
             f"{versions['python']}, torch {versions['torch']}, torch_metallib {versions['torch_metallib']}, "
             f"llvmlite {versions['llvmlite']}; {result['repeat']} fresh processes per figure", ""]
    rows = [(label, figure["unit"], _value(figure, "median"), _value(figure, "p10"), _value(figure, "p90"))
            for label, figure in result["figures"].items()]
    rows += [(label, "x", f"{ratio:.3g}", "", "") for label, ratio in result["ratios"].items()]  # 0.04x too
    rows += [(f"time to first result: {name}", "ms", f"{entry['total_ms']:.1f}", "", "")
             for name, entry in result["first_result"].items()]
    header = ("figure", "unit", "median", "p10", "p90")
    if markdown:
        lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    else:
        width = max(len(row[0]) for row in rows + [header])
        lines.append(f"{header[0]:<{width}}  {header[1]:<4} {header[2]:>10} {header[3]:>10} {header[4]:>10}")
        lines += [f"{r[0]:<{width}}  {r[1]:<4} {r[2]:>10} {r[3]:>10} {r[4]:>10}" for r in rows]
    if result["targets"]:
        lines += ["", "targets (the project's, set on mlx.metallib):"]
        lines += [f"  {'met   ' if t['met'] else 'MISSED'} {label}: {t['value']:.2f}"
                  for label, t in result["targets"].items()]
    if "scenario" in result:
        lines += ["", *_scenario_lines(result["scenario"])]
    if result["not_measured"]:
        lines += ["", "not measured:"]
        lines += [f"  {label}: {reason}" for label, reason in result["not_measured"].items()]
    return "\n".join(lines)


def _scenario_lines(scenario: dict) -> list:
    archive = scenario["archive"]
    lines = [f"scenario {scenario['name']}: {scenario['description']}",
             f"  {scenario['distinct_kernels']} distinct compiles: "
             + ", ".join(c["kernel"] + (" " + ",".join(f"{k}={v}" for k, v in c["constants"].items() if v)
                                        if any(c["constants"].values()) else "")
                         for c in scenario["compiles"]),
             f"  archive ({', '.join(archive['targets'])}): {archive['bytes']:,} bytes, built in "
             f"{archive['build_s']:.1f} s" + (f"; {archive['failed']} failed to build" if archive["failed"] else "")]
    for mode, kernels in scenario["compiled"].items():
        sources = {}
        for _, where in kernels:
            sources[where] = sources.get(where, 0) + 1
        lines.append(f"  {mode}: " + ", ".join(f"{count} {where}" for where, count in sources.items()))
    return lines


def _bars(axes, approaches: dict, colors: dict, palette, skip_imports: bool) -> None:
    names = list(approaches)
    for row, name in enumerate(names):
        left = 0.0
        for phase, ms in approaches[name]["phases"].items():
            if ms is None or (skip_imports and phase.startswith("import")):
                continue
            new = phase not in colors
            color = colors.setdefault(phase, palette[len(colors) % len(palette)])
            axes.barh(row, ms, left=left, color=color, label=phase if new else None)
            left += ms
        axes.text(left, row, f" {left:.1f} ms", va="center", fontsize="small")
    axes.margins(x=0.25)


def plot(result: dict, path: str) -> None:
    """Two panels of horizontal bars, one bar per approach split into its phases (median
    ms): from a fresh process, and the same without the imports (which dwarf the rest)."""
    pyplot = require_matplotlib()
    approaches = result["first_result"]
    figure, (whole, after) = pyplot.subplots(1, 2, figsize=(13, 1.6 + 0.6 * len(approaches)), sharey=True)
    colors, palette = {}, pyplot.get_cmap("tab10").colors
    _bars(whole, approaches, colors, palette, skip_imports=False)
    _bars(after, approaches, colors, palette, skip_imports=True)
    whole.set_yticks(range(len(approaches)), list(approaches))  # shared with `after`
    whole.invert_yaxis()
    whole.set_xlabel("ms, fresh process to " + ("the scenario's first result" if "scenario" in result
                                                 else "first finished kernel"))
    after.set_xlabel("ms, the same after the imports")
    library = result["library"]
    if "scenario" in result:
        what = (f"scenario {result['scenario']['name']} ({result['scenario']['distinct_kernels']} distinct "
                f"compiles)")
    else:
        what = f"{result['kernels'][0]}"
    figure.suptitle(f"Time to first result: {library['path'].rsplit('/', 1)[-1]} ({library['functions']:,} functions), "
                    f"{what} on {result['device']}; torch {result['versions']['torch']}, "
                    f"medians of {result['repeat']}")
    figure.legend(loc="lower center", ncol=len(colors), fontsize="small", frameon=False)
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
