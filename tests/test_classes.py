"""Objects, not mixins: no class of the product is assembled from more than MOST_MIXINS mixins, checked on the
source. A class's bases are its mixins and, last, the one base it is (Python's order: mixins first); a
feature grows an object the class composes, or a widget that posts messages, not one more mixin that shares
the class's private state (kvchat's chat app was once seven)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "engine", "storage")
MOST_MIXINS = 2


def classes() -> list[tuple[str, ast.ClassDef]]:
    """(where, class) for every class statement of the product, nested and type-only ones included."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    found.append((f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", node))
    return found


def mixins(node: ast.ClassDef) -> list[str]:
    """The bases before the last one."""
    return [ast.unparse(base) for base in node.bases[:-1]]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_class_is_assembled_from_more_than_two_mixins(package):
    crowded = [f"{where}: {', '.join(mixins(node))}" for where, node in classes()
               if where.startswith(package + "/") and len(mixins(node)) > MOST_MIXINS]
    assert not crowded, "grow an object the class composes instead:\n" + "\n".join(crowded)


def test_the_check_sees_a_class_of_many_mixins():
    node = ast.parse("class App(A, B, C, Base): pass").body[0]
    assert mixins(node) == ["A", "B", "C"]
