"""``puffergpt backends``: the installed backends, where each comes from, and the settings each
is opened with (its flag, its environment variable), as ``--backend`` finds them."""

from __future__ import annotations

import click

from puffergpt import stores


@click.command("backends")
def backends() -> None:
    """List the installed backends and their settings."""
    for name, target in stores.backends().items():
        where = target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__} (registered)"
        click.echo(f"{name}  {where}")
        try:
            declared = stores.settings_of(name)
        except Exception as e:  # a broken plugin is listed, with why it can't be used
            click.echo(f"    can't be read: {e}")
            continue
        for s in declared:
            given = " or ".join(filter(None, (s.flag, s.env and f"${s.env}")))
            click.echo(f"    {s.name}: {given}{' (secret)' if s.secret else ''}  {s.help}")
