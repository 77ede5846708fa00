"""A griffe extension for the documentation site: Sphinx cross-reference roles become links.

gradzip's docstrings cite other objects the Sphinx way (``:class:`~gradzip.errors.GradzipError```,
``:func:`gradzip_hook```, ``:mod:`gradzip.feedback```). mkdocstrings renders Markdown, where
those roles would show as literal text; this turns each into an optional cross-reference
(``<autoref optional ...>``): a link where the target is in the API reference, plain code
where it is not (a private module, a name outside the reference). A role whose full path
(``gradzip....``) names no object is reported as a warning, which fails ``mkdocs build --strict``. Loaded by
``mkdocs.yml``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

#: ``:role:`target``` or ``:role:`~target``` (``~``: show the last component only)
ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([\w.]+)`")


def _exists(root: griffe.Object, path: str) -> bool:
    """Whether ``path`` (``gradzip.a.b``) names a member of the loaded package ``root``."""
    obj: griffe.Object | griffe.Alias = root
    for name in path.split(".")[1:]:
        if name not in obj.members:
            return False
        obj = obj.members[name]
    return True


def _linked(match: re.Match[str], owner: griffe.Object, root: griffe.Object) -> str:
    short, target = match.group(1), match.group(2)
    shown = target.rsplit(".", 1)[-1] if short else target
    qualified = "." in target
    if not qualified:  # a name of the docstring's own module or class
        module = owner if owner.is_module else owner.module
        scope = owner if owner.is_class else owner.parent or module
        target = f"{scope.path}.{target}" if target in scope.members else f"{module.path}.{target}"
    # a short name may be inherited or belong to a class the module describes: only full paths
    # are checked
    if qualified and target.split(".")[0] == root.name and not _exists(root, target):
        griffe.logger.warning(f"{owner.path}: {match.group(0)} names no object of {root.name}")
    return f'<autoref optional identifier="{target}"><code>{shown}</code></autoref>'


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring once the package is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._rewrite(pkg, pkg)

    def _rewrite(self, obj: griffe.Object, root: griffe.Object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(lambda m: _linked(m, obj, root), obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                assert isinstance(member, griffe.Object)
                self._rewrite(member, root)
