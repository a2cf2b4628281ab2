"""The command line's flags are made from the options' declarations (issue 55 part 3, issue 58 part 1): each
option is declared once (`phaseinterp._checks.option`: its default, help, how a string is read, what it
needs or excludes) on an options dataclass, and the subcommands' flags, and what each flag needs, are read
from there. No second table of flags or of their needs is left."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from phaseinterp import _checks
from phaseinterp._checks import Spec, cli_fields, dest_of, flag_of
from phaseinterp.cli import args as cli_args
from phaseinterp.cli.args import build_parser, declared_needs

# The subcommands whose every flag is generated (MODEL, a positional, is written by hand).
GENERATED = ("profile", "ablate", "cycle", "gates", "conformance")
EXPERIMENT_OPTIONS = (_checks.ProfileOptions, _checks.AblationOptions, _checks.CyclingOptions,
                      _checks.UnitCyclingOptions, _checks.GateProfileOptions, _checks.ConformanceOptions)


def _leaf_parsers(parser=None, prefix=""):
    parser = parser or build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix.strip(), parser
        return
    for name, sub in subs[0].choices.items():
        yield from _leaf_parsers(sub, f"{prefix} {name}")


LEAVES = dict(_leaf_parsers())


def test_the_second_declaration_is_gone():
    """Needs live on the fields only: no FLAG_NEEDS / FLAG_EXCLUDES table, no Spec.NEEDS / EXCLUDES / ARGS."""
    for name in ("FLAG_NEEDS", "FLAG_EXCLUDES", "axis_options"):
        assert not hasattr(cli_args, name), name
    for name in ("NEEDS", "EXCLUDES", "ARGS"):
        assert not hasattr(Spec, name), name


def test_the_generated_commands_declare_their_options():
    for command in GENERATED:
        assert LEAVES[command].get_default("declared"), command


@pytest.mark.parametrize("command", sorted(c for c, p in LEAVES.items() if p.get_default("declared")))
def test_every_generated_flag_maps_to_exactly_one_declared_option(command):
    """Each flag made from a declaration is that option's (its dest, its default), one option per options class;
    on the generated commands no flag is left without a declaration, and every option with help has its flag
    (an option without help is declared Python-only)."""
    parser = LEAVES[command]
    actions = {s: a for a in parser._actions for s in a.option_strings if s.startswith("--")}
    owners: dict[str, list] = {}
    for cls in parser.get_default("declared"):
        flags = [flag_of(f) for f in cli_fields(cls)]
        assert len(flags) == len(set(flags)), (cls.__name__, flags)
        for field in cli_fields(cls):
            owners.setdefault(flag_of(field), []).append((cls, field))
    for flag, fields in owners.items():
        if dest_of(fields[0][1]) in (parser.get_default("skipped") or ()):
            assert flag not in actions, (command, flag)
            continue
        assert flag in actions, f"{command}: {flag} is declared but has no flag"
        action = actions[flag]
        for cls, field in fields:
            assert action.dest == dest_of(field), (command, flag, cls.__name__)
            assert action.help, (command, flag)
        first = fields[0][1]
        if first.metadata.get("parse") == "ints" or first.default is False or flag == "--out":
            continue
        assert action.default == first.default, (command, flag, action.default, first.default)
        for _, field in fields[1:]:  # one flag for several classes (cycle's scores): read alike
            assert {k: field.metadata.get(k) for k in ("parse", "choices", "many")} == \
                   {k: first.metadata.get(k) for k in ("parse", "choices", "many")}, (command, flag)
    if command in GENERATED:
        orphans = sorted(set(actions) - set(owners) - {"--help"})
        assert not orphans, f"{command}: flags without a declared option: {orphans}"


@pytest.mark.parametrize("options", EXPERIMENT_OPTIONS, ids=lambda c: c.__name__)
def test_each_option_s_needs_name_fields_of_its_own_class(options):
    names = {f.name for f in dataclasses.fields(options)}
    for field in dataclasses.fields(options):
        for other, _want in field.metadata.get("needs", ()):
            assert other in names, (options.__name__, field.name, other)
        excludes = field.metadata.get("excludes")
        if excludes:
            assert excludes[0] in names, (options.__name__, field.name, excludes)


def test_a_spec_is_its_options_class_with_the_checks():
    """The spec classes add the checks only: their fields are the declared options'."""
    import phaseinterp as pi

    for spec, options in ((pi.ProfileSpec, _checks.ProfileOptions), (pi.AblationSpec, _checks.AblationOptions),
                          (pi.CyclingSpec, _checks.CyclingOptions), (pi.UnitCyclingSpec, _checks.UnitCyclingOptions),
                          (pi.GateProfileSpec, _checks.GateProfileOptions),
                          (pi.ConformanceSpec, _checks.ConformanceOptions)):
        assert issubclass(spec, options) and dataclasses.fields(spec) == dataclasses.fields(options)


def test_the_needs_of_cycle_s_scores_follow_from_which_class_takes_a_flag():
    """``--score`` selects the options class; a flag only one score takes needs that score, with no table."""
    needs, excludes = declared_needs(LEAVES["cycle"].get_default("declared"))
    assert needs["measure"] == (("score", "unit"),)
    assert needs["branch"] == (("score", "profile"),)
    assert needs["baseline"] == (("score", "profile"),)
    assert "n_per_residue" not in needs and "layer" not in needs
    assert excludes["baseline"][0] == "shard_dir"
