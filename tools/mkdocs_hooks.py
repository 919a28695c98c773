"""MkDocs hooks (mkdocs.yml): ARCHITECTURE.md, the code map at the repository root, is also
the site's Architecture page. Its links into docs/ are rewritten for the page's place in the
site, and the pages' links to ../ARCHITECTURE.md (right on GitHub) point at that page."""

import pathlib
import re

from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = "architecture.md"
TO_ARCHITECTURE = re.compile(r"\]\(((?:\.\./)+)ARCHITECTURE\.md(#[^)]*)?\)")


def on_files(files, config):
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    text = re.sub(r"\]\(docs/", "](", text)
    files.append(File.generated(config, PAGE, content=text))
    return files


def on_page_markdown(markdown, page, config, files):
    depth = page.file.src_uri.count("/")

    def relink(match):
        if len(match.group(1)) // 3 != depth + 1:      # not a link out of docs/
            return match.group(0)
        return f"]({'../' * depth}{PAGE}{match.group(2) or ''})"

    return TO_ARCHITECTURE.sub(relink, markdown)


# The docstrings use Sphinx roles (:class:`~torch_metallib.Library`, :func:`define`), which
# mkdocstrings would print as written. This griffe extension (mkdocs.yml, mkdocstrings'
# `extensions`) turns a qualified one into a cross-reference and any other into code.
ROLE = re.compile(r":(?:class|func|meth|attr|mod|exc|obj|data):`(~?)([\w.]+)`")


def _role_to_markdown(match):
    short, target = match.groups()
    if "." not in target:
        return f"`{target}`"
    return f"[`{target.rsplit('.', 1)[-1] if short else target}`][{target}]"


try:
    import griffe
except ImportError:  # the hooks run under MkDocs, which does not need griffe itself
    griffe = None
else:
    class SphinxRoles(griffe.Extension):
        def on_object(self, *, obj, **kwargs):
            if obj.docstring is not None:
                obj.docstring.value = ROLE.sub(_role_to_markdown, obj.docstring.value)
