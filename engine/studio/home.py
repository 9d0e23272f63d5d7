"""What `funnel studio` opens: funnel files, and a folder where the page's new funnels go.

``funnel studio`` with no argument opens the current folder; a folder argument opens the
funnels `funnel new` made in it (``DIR/*/funnel.yaml``) and is where **New funnel**
writes. A folder with no funnel yet is fine: the studio starts empty and the page offers
**New funnel** (docs/studio.md, "From nothing to a funnel that passes its scenarios").
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError

__all__ = ["resolve"]


def resolve(arguments: list[str]) -> tuple[list[Path], Path | None]:
    """The funnel files to open and the studio's home folder (``None``: files only, new
    funnels go beside the first one).

    Raises:
        ConfigError: a path that is neither a file nor a folder, or two folders.
    """
    funnels: list[Path] = []
    home: Path | None = None
    for raw in arguments or ["."]:
        path = Path(raw)
        if path.is_dir():
            if home is not None:
                raise ConfigError(f"two folders given ({home}, {path}): the studio writes new "
                                  "funnels into one; give one folder and any funnel files")
            home = Path(os.path.realpath(path))
            funnels += sorted(home.glob("*/funnel.yaml"))
        elif path.is_file():
            funnels.append(path)
        else:
            raise ConfigError(f"no funnel file or folder at {raw}")
    return funnels, home
