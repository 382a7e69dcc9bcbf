"""The import rules of the layout (README, Layout), checked on the source: they fail on the first
import that breaks them, wherever it hides (inside a function, under TYPE_CHECKING).

- `engine` imports neither `app` nor `storage`;
- the engine's rooms are layered (ENGINE_ROOMS): each imports only the rooms before it and the engine's
  top-level helpers (ENGINE_HELPERS), never engine.engine;
- no product module imports a bench package (engine/bench, app/bench), except the `kvchat` command
  line, which reaches `kvchat bench` from inside a function;
- the chat app (app/tui) and a conversation (app/chat, app/remote) never import the command line (app/cli);
- a conversation (app/chat) imports neither the chat app (app/tui), the command line nor the server (app/server);
- the chat's rooms are layered by the path of a turn (CHAT_ROOMS): each imports only the rooms before it and
  app/chat's top-level modules, and only context/ (which works on a session) imports the session's
  (CHAT_SESSION: the session and what builds one);
- in storage, the conversation database (storage/db) never imports the K/V block store (storage/kv), which
  keeps its index in that database; only storage/purge.py (the trash's purge) and storage/usage.py (sizes,
  read-only) compose the two, and the old snapshot format (storage/kv/legacy) is read by nothing else in storage;
- no folder of the product (engine, storage, app and each folder under them) holds more than MOST_MODULES modules;
- there is no import cycle between modules, deferred and type-only imports counted.
"""

import ast
from pathlib import Path

import engine

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "engine", "storage")
BENCH = ("app.bench", "engine.bench")
BENCH_ENTRY = "app.cli.main"  # `kvchat bench` is one of its commands
# The engine's rooms, lowest first: config says what a model is (read from its files, before any tensor),
# attention is math over tensors, recurrent keeps a hybrid model's per-sequence state and its math, kv keeps
# K/V (and that state) and calls attention, the model runs on kv, the CPU's kernels and fused step run the model's layers, the GPU decode path captures the
# model, weights load a model (into the CPU's formats), sources find where a model comes from (the spec
# typed, other apps' stores) and judge it by the weights' rules, and a request drives all of them.
ENGINE_ROOMS = ("config", "attention", "recurrent", "kv", "model", "cpu", "gguf", "decode", "tokenizer", "weights", "sources",
                "request")
ENGINE_HELPERS = ("engine.errors", "engine.events", "engine.paths", "engine.sampling_params")  # any room's
# The chat's rooms, lowest first: a turn's prompt, the conversation as kept, the reply (written into what is
# kept), and the ways on when the window is full (which start a turn on a session).
CHAT_ROOMS = ("prompt", "saved", "tools", "reply", "context")
CHAT_SESSION = ("app.chat.session", "app.chat.remote_session", "app.chat.backend_loader")
MOST_MODULES = 15  # per folder, __init__.py not counted: a wider folder is rooms waiting to happen


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imports(module: str) -> list[tuple[str, bool]]:
    """(imported module, whether the import is at module level) for every import in `module`."""
    tree = ast.parse(MODULES[module].read_text())
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = []
            for alias in node.names:
                if f"{node.module}.{alias.name}" in MODULES:  # from package import module
                    names.append(f"{node.module}.{alias.name}")
                elif node.module == "engine" and alias.name in engine._EXPORTS:  # the package's lazy names
                    names.append(engine._EXPORTS[alias.name])
                else:
                    names.append(node.module)
        else:
            continue
        found += [(name, id(node) in top_level) for name in names if name.split(".")[0] in PACKAGES]
    return found


def in_package(module: str, packages) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_the_engine_imports_neither_the_app_nor_storage():
    bad = [(m, i) for m in MODULES if in_package(m, ["engine"]) for i, _ in imports(m)
           if in_package(i, ["app", "storage"])]
    assert bad == []


def test_each_engine_room_imports_only_the_rooms_below_it():
    rooms = {m.split(".")[1] for m, path in MODULES.items() if m.startswith("engine.") and path.name == "__init__.py"}
    assert rooms == {*ENGINE_ROOMS, "bench"}, "a new engine room takes its place in ENGINE_ROOMS"
    bad = []
    for level, room in enumerate(ENGINE_ROOMS):
        allowed = [f"engine.{r}" for r in ENGINE_ROOMS[: level + 1]] + list(ENGINE_HELPERS)
        for module in MODULES:
            if in_package(module, [f"engine.{room}"]):
                bad += [(module, i) for i, _ in imports(module)
                        if in_package(i, ["engine"]) and not in_package(i, allowed)]
    assert bad == []


def test_the_chat_app_and_a_conversation_do_not_import_the_command_line():
    bad = [(m, i) for m in MODULES if in_package(m, ["app.tui", "app.chat", "app.remote"]) for i, _ in imports(m)
           if in_package(i, ["app.cli"])]
    assert bad == []


def test_product_modules_do_not_import_the_bench_packages():
    bad = []
    for module in MODULES:
        if in_package(module, BENCH):
            continue
        for imported, top_level in imports(module):
            if in_package(imported, BENCH) and (module != BENCH_ENTRY or top_level or imported.startswith("engine")):
                bad.append((module, imported))
    assert bad == []


def test_there_is_no_import_cycle():
    graph = {m: {i for i, _ in imports(m) if i in MODULES and i != m} for m in MODULES}
    # Tarjan's strongly connected components: any with more than one module is a cycle.
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_rules_see_deferred_imports():
    # The check itself: a function-level import counts (app/cli/main.py reaches app.bench that way).
    assert ("app.bench.main", False) in imports("app.cli.main")


def test_the_conversation_database_does_not_import_the_block_store():
    bad = [(m, i) for m in MODULES if in_package(m, ["storage.db"]) for i, _ in imports(m)
           if in_package(i, ["storage.kv"])]
    assert bad == []


def test_only_the_legacy_folder_reads_the_old_snapshot_format_in_storage():
    bad = [(m, i) for m in MODULES if in_package(m, ["storage"]) and not in_package(m, ["storage.kv.legacy"])
           for i, _ in imports(m) if in_package(i, ["storage.kv.legacy"])]
    assert bad == []


def test_no_folder_of_the_product_holds_more_than_most_modules():
    widths = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name != "__init__.py":
                folder = str(path.parent.relative_to(ROOT))
                widths[folder] = widths.get(folder, 0) + 1
    assert "storage/db" in widths and "app/chat/prompt" in widths  # the walk sees the folders under the packages
    assert {folder: n for folder, n in widths.items() if n > MOST_MODULES} == {}


def test_a_conversation_imports_neither_the_chat_app_the_command_line_nor_the_server():
    bad = [(m, i) for m in MODULES if in_package(m, ["app.chat"]) for i, _ in imports(m)
           if in_package(i, ["app.tui", "app.cli", "app.server"])]
    assert bad == []


def test_each_chat_room_imports_only_the_rooms_below_it():
    rooms = {m.split(".")[2] for m, path in MODULES.items() if m.startswith("app.chat.") and path.name == "__init__.py"}
    assert rooms == set(CHAT_ROOMS), "a new room of the chat takes its place in CHAT_ROOMS"
    bad = []
    for level, room in enumerate(CHAT_ROOMS):
        above = [f"app.chat.{r}" for r in CHAT_ROOMS[level + 1:]]
        if room != "context":
            above += CHAT_SESSION
        for module in MODULES:
            if in_package(module, [f"app.chat.{room}"]):
                bad += [(module, i) for i, _ in imports(module) if in_package(i, above)]
    assert bad == []
