"""``biasviz schemes``: the table of positional schemes, read from the registry."""

from __future__ import annotations

import json

import click

from biasviz.schemes import TABLE


def scheme_rows() -> list[dict[str, object]]:
    """One row per scheme of the registry's table (also used to generate README's table)."""
    return [
        {
            "name": s.name,
            "aliases": list(s.aliases),
            "bias": s.formula,
            "context_dependent": s.context_dependent,
            "options": dict(s.default_options),
            "reference": s.reference,
        }
        for s in TABLE
    ]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON instead of a table.")
@click.option("--markdown", is_flag=True, help="Print a Markdown table (as in README).")
def schemes(as_json: bool, markdown: bool) -> None:
    """List the positional schemes: name, aliases, bias b_h(i, j) for d = i - j, reference."""
    rows = scheme_rows()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if markdown:
        click.echo("| scheme | aliases | b_h(i, j), d = i - j | depends on input | reference |")
        click.echo("| --- | --- | --- | --- | --- |")
        for r in rows:
            aliases = ", ".join(f"`{a}`" for a in r["aliases"]) or "—"  # type: ignore[union-attr]
            dep = "yes" if r["context_dependent"] else "no"
            click.echo(f"| `{r['name']}` | {aliases} | `{r['bias']}` | {dep} | {r['reference']} |")
        return
    width = max(len(str(r["name"])) for r in rows)
    for r in rows:
        aliases = f" (alias {', '.join(r['aliases'])})" if r["aliases"] else ""  # type: ignore[arg-type]
        dep = "context-dependent" if r["context_dependent"] else "context-independent"
        click.echo(f"{r['name']:<{width}}  {r['bias']}")
        click.echo(f"{'':<{width}}  {dep}; {r['reference']}{aliases}")
