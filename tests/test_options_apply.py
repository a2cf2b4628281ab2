"""Options that cannot apply are refused, and an argument of the wrong kind is named as such
(issue 45, class 5): walked over every public function with the parameters the rule is about."""

from __future__ import annotations

import inspect

import pytest
import torch

import phaseinterp as pi
from phaseinterp._checks import env_flag
from phaseinterp.errors import UserInputError

# Public functions that take a model's name or folder on purpose (they load it).
TAKES_NAMES = {"load", "load_hf", "from_hf", "build_report", "from_pretrained"}


def _public_functions():
    for name in pi.__all__:
        obj = getattr(pi, name)
        if inspect.isfunction(obj) or (callable(obj) and hasattr(obj, "__wrapped__") and not inspect.isclass(obj)):
            yield name, obj


def _params(fn):
    return inspect.signature(fn).parameters


PROMPT_TAKERS = [name for name, fn in _public_functions() if {"prompts", "n_per_residue"} <= set(_params(fn))]
MODEL_TAKERS = [name for name, fn in _public_functions()
                if next(iter(_params(fn)), None) == "model" and name not in TAKES_NAMES]


@pytest.fixture(scope="module")
def w4s4():
    return pi.load("w4s4")


def test_the_walks_find_the_experiments():
    assert {"ablate", "gate_cycling_profile", "gate_cycling_unit", "gate_profile"} <= set(PROMPT_TAKERS)
    assert {"phase_profile", "ablate", "conformance", "gate_cycling_profile"} <= set(MODEL_TAKERS)


def test_a_ready_batch_with_a_size_is_refused(w4s4):
    """The reported instance: phase_profile(model, task.generate(72), n_per_residue=80) ran 1,728 prompts."""
    batch = pi.zoo.task_for(w4s4).generate(72)
    with pytest.raises(UserInputError, match=r"n_per_residue=80 does not apply here: task= is a ready TaskBatch "
                                             r"of 1728 prompts"):
        pi.phase_profile(w4s4, batch, n_per_residue=80)


@pytest.mark.parametrize("name", PROMPT_TAKERS)
def test_prompts_and_a_size_together_are_refused(name, w4s4):
    fn = getattr(pi, name)
    batch = pi.zoo.task_for(w4s4).generate(72)
    extra = {"shifts": [1]} if "shifts" in _params(fn) else {}
    if "layers" in _params(fn) and name == "gate_cycling_unit":
        extra["layers"] = [0]
    with pytest.raises(UserInputError) as err:
        fn(w4s4, prompts=batch, n_per_residue=72, **extra)
    message = str(err.value)
    assert message.startswith("n_per_residue=72 does not apply here: prompts= gives the prompts") and "\n" not in message


def test_engine_only_options_are_not_phase_profile_s(w4s4):
    for option in ("retries", "retry_wait", "resume_dir"):  # engine_profile's
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{option}'"):
            pi.phase_profile(w4s4, **{option: 2})


def test_a_precomputed_sweep_takes_no_sweep_options(w4s4):
    # a sweep of every layer on 48 prompts: the refusals and the selection need a sweep, not its size
    prompts = pi.zoo.task_for(w4s4).generate(2, seed=0, strict=False)
    ablation = pi.ablate(w4s4, prompts=prompts, n_calibration=48, progress=False)
    for option, value in (("n_per_residue", 96), ("seed", 3), ("n_calibration", 300), ("layers", [0])):
        with pytest.raises(UserInputError, match=f"{option}=.* does not apply here: ablation= is the sweep"):
            pi.specialized_units(w4s4, ablation=ablation, **{option: value})
    assert pi.specialized_units(w4s4, ablation=ablation).table is not None


@pytest.mark.parametrize("name", MODEL_TAKERS)
def test_a_model_name_instead_of_a_model_is_named(name):
    """The reported instance: pi.ablate("w4s4") said "no task given"."""
    fn = getattr(pi, name)
    fillers = {"shifts": [1], "shift": 1, "tokens": torch.zeros(1, 8, dtype=torch.long), "layers": [0],
               "mean_logits": {}}
    params = _params(fn)
    extra = {k: v for k, v in fillers.items() if k in params}
    if "task" in params and params["task"].default is inspect.Parameter.empty:
        extra["task"] = None
    with pytest.raises(UserInputError, match=r"model='w4s4' is a str, not a model: load it first"):
        out = fn("w4s4", **extra)
        if hasattr(out, "__enter__"):  # a context manager checks on entry
            with out:
                pass


@pytest.mark.parametrize("text, on", [("", False), ("0", False), ("false", False), ("FALSE", False), ("no", False),
                                      ("off", False), ("1", True), ("true", True), ("yes", True)])
def test_environment_switches_read_false_as_off(monkeypatch, text, on):
    monkeypatch.setenv("PHASEINTERP_NO_PROGRESS", text)
    assert env_flag("PHASEINTERP_NO_PROGRESS") is on


# ------------------------------------------------------------------ every environment variable phaseinterp reads
# name -> how it is read. A "switch" is read only through `_checks.env_flag` (unset, "", 0, false, no,
# off: off); every other variable is a value of its own kind, read where it says.
ENV_READS = {
    "PHASEINTERP_NO_PROGRESS": "switch",
    "PHASEINTERP_PLOTLYJS": "a mode: 'inline' or 'cdn' (results._plotly_js; anything else refused by name)",
    "BROWSER_PATH": "a path to a Chromium (plot.export.find_browser)",
    "XDG_CACHE_HOME": "a folder (engines.llama_prebuilt's cache)",
    "RANK": "an integer set by torchrun (parallel.launch._env_int refuses anything else by name)",
    "WORLD_SIZE": "an integer set by torchrun (_env_int); its presence means a torchrun launch (cli)",
    "LOCAL_RANK": "an integer set by torchrun (_env_int); its presence marks a worker process (cli)",
}
ENV_HELPERS = {"env_flag": "switch", "_env_int": "integer"}  # functions that read a variable they are given


def _environment_reads():
    """(file, function, how, name or None) for every read of the environment in phaseinterp/: os.environ.get,
    os.getenv, os.environ[...], `... in os.environ`, and the helpers' calls with a literal name."""
    import ast
    from pathlib import Path

    root = Path(pi.__file__).parent
    reads = []
    for file in sorted(root.rglob("*.py")):
        tree = ast.parse(file.read_text())
        enclosing = {}  # node -> the innermost function around it ("<module>" at top level)
        stack = [(tree, "<module>")]
        while stack:
            node, name = stack.pop()
            for child in ast.iter_child_nodes(node):
                inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else name
                enclosing[child] = inner
                stack.append((child, inner))
        for node in ast.walk(tree):
            text = ast.unparse(node) if isinstance(node, (ast.Call, ast.Subscript, ast.Compare)) else ""
            literal = None
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv",
                                                                         "os.environ.setdefault", *ENV_HELPERS):
                how = ast.unparse(node.func)
                arg = node.args[0] if node.args else None
                literal = arg.value if isinstance(arg, ast.Constant) else None
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
                how = "os.environ[]"
                literal = node.slice.value if isinstance(node.slice, ast.Constant) else None
            elif isinstance(node, ast.Compare) and any(ast.unparse(c) == "os.environ" for c in node.comparators):
                how = "in os.environ"
                literal = node.left.value if isinstance(node.left, ast.Constant) else None
            else:
                continue
            reads.append((str(file.relative_to(root)), enclosing.get(node, "<module>"), how, literal, text))
    # a function body's reads were also walked from the module; keep each once
    return sorted(set(reads))


def test_every_environment_read_is_listed_and_switches_use_env_flag():
    reads = _environment_reads()
    assert reads, "the walk found no environment read"
    seen = set()
    for file, function, how, name, text in reads:
        if name is None:  # a variable name: only the helpers, which read what their callers name
            assert function in ENV_HELPERS, f"{file}:{function} reads the environment by a computed name: {text}"
            continue
        seen.add(name)
        assert name in ENV_READS, f"{file}:{function} reads {name} (list it in ENV_READS with how it is read)"
        if ENV_READS[name] == "switch":
            assert how == "env_flag", f"{file}:{function} reads the switch {name} without env_flag: {text}"
    assert seen == set(ENV_READS), f"ENV_READS lists variables nothing reads: {set(ENV_READS) - seen}"


@pytest.mark.parametrize("name", [n for n, how in ENV_READS.items() if how == "switch"])
@pytest.mark.parametrize("text, on", [("", False), ("0", False), ("false", False), (" False ", False),
                                      ("no", False), ("OFF", False), ("1", True), ("true", True), ("yes", True)])
def test_every_switch_reads_false_as_off(monkeypatch, name, text, on):
    monkeypatch.setenv(name, text)
    assert env_flag(name) is on


def test_progress_bars_follow_the_switch(monkeypatch):
    """The switch where it acts: PHASEINTERP_NO_PROGRESS=0 leaves progress bars on, =1 turns them off."""
    from phaseinterp._files import progress_bar

    monkeypatch.setenv("PHASEINTERP_NO_PROGRESS", "0")
    bar = progress_bar(True, 3, "x")
    assert bar is not None
    bar.close()
    monkeypatch.setenv("PHASEINTERP_NO_PROGRESS", "1")
    assert progress_bar(True, 3, "x") is None


def test_a_plotlyjs_mode_that_is_not_one_is_named(monkeypatch):
    from phaseinterp import results

    monkeypatch.setenv("PHASEINTERP_PLOTLYJS", "0")
    with pytest.raises(UserInputError, match=r"PHASEINTERP_PLOTLYJS='0' is not one of 'inline', 'cdn'"):
        results._plotly_js()
