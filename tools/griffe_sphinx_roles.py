"""A griffe extension for the documentation site: Sphinx cross-reference roles become links.

gradzip's docstrings cite other objects the Sphinx way (``:class:`~gradzip.errors.GradzipError```,
``:func:`gradzip_hook```, ``:mod:`gradzip.feedback```). mkdocstrings renders Markdown, where
those roles would show as literal text; this turns each into an optional cross-reference
(``<autoref optional ...>``): a link where the target is in the API reference, plain code
where it is not (a private module, a name outside the reference). Loaded by ``mkdocs.yml``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

#: ``:role:`target``` or ``:role:`~target``` (``~``: show the last component only)
ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([\w.]+)`")


def _linked(match: re.Match[str], owner: griffe.Object) -> str:
    short, target = match.group(1), match.group(2)
    shown = target.rsplit(".", 1)[-1] if short else target
    if "." not in target:  # a name of the docstring's own module or class
        module = owner if owner.is_module else owner.module
        scope = owner if owner.is_class else owner.parent or module
        target = f"{scope.path}.{target}" if target in scope.members else f"{module.path}.{target}"
    return f'<autoref optional identifier="{target}"><code>{shown}</code></autoref>'


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring once the package is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._rewrite(pkg)

    def _rewrite(self, obj: griffe.Object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(lambda m: _linked(m, obj), obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                assert isinstance(member, griffe.Object)
                self._rewrite(member)
