"""The sfc-host command line: recipe check, recipe diagram, argument errors (the demo:
tests/house/test_demo.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import cli
from helpers.recipes import linear, reference_recipes_dir
from helpers.servers import in_ci

REF = reference_recipes_dir()


def test_check_prints_a_summary_per_recipe(capsys) -> None:
    rc, out, _ = cli(capsys, "recipe", "check", str(REF / "axle_fit_qa.json"),
                     str(REF / "tighten_rework.json"))
    assert rc == 0
    lines = out.strip().splitlines()
    assert len(lines) == 2
    assert "ok, recipe v1.0.0, 6 steps, 4 actions, 1 branch," in lines[0]
    assert "fingerprint " in lines[0]


def test_check_lists_every_problem_with_code_and_path(capsys) -> None:
    rc, out, err = cli(capsys, "recipe", "check", str(REF / "bad_two_initial.json"))
    assert rc == 1
    assert "Traceback" not in out + err
    problems = [ln for ln in out.splitlines() if ": SFC" in ln]
    assert len(problems) == 6
    assert any("SFC001 $.Steps:" in ln for ln in problems)
    assert any("SFC012 $.Actions[0].HoldTypeId:" in ln for ln in problems)


def test_check_json_output(capsys) -> None:
    rc, out, _ = cli(capsys, "recipe", "check", "--json", str(REF / "axle_fit_qa.json"),
                     str(REF / "bad_two_initial.json"))
    assert rc == 1
    doc = json.loads(out)
    assert doc[0]["ok"] and doc[0]["steps"] == 6
    assert not doc[1]["ok"] and len(doc[1]["problems"]) == 6


def test_check_bare_recipe_needs_dataschema(capsys, tmp_path: Path) -> None:
    f = tmp_path / "bare.json"
    f.write_text(json.dumps(linear(3)))
    rc, _, err = cli(capsys, "recipe", "check", str(f))
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--dataschema" in err
    rc, out, _ = cli(capsys, "recipe", "check", "--dataschema", "1.1.0", str(f))
    assert rc == 0 and "3 steps" in out


def test_check_of_a_file_that_is_not_json_is_a_problem(capsys, tmp_path: Path) -> None:
    f = tmp_path / "x.json"
    f.write_text("{nope")
    rc, out, _ = cli(capsys, "recipe", "check", str(f))
    assert rc == 1 and "SFC014" in out


@pytest.mark.parametrize("argv", [
    ["recipe", "check"],
    ["recipe", "check", "/nonexistent/file.json"],
    ["recipe", "bogus"],
    ["bogus"],
    ["recipe", "check", "--wrong-flag", "x.json"],
    [],
])
def test_wrong_arguments_are_one_line_and_exit_2(capsys, argv: list[str]) -> None:
    rc, out, err = cli(capsys, *argv)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in out + err


def test_check_reports_every_file_past_an_unreadable_one(capsys, tmp_path: Path) -> None:
    files = [str(tmp_path / "missing.json"), str(REF / "axle_fit_qa.json"), str(tmp_path),
             str(REF / "bad_two_initial.json"), str(REF / "tighten_rework.json")]
    rc, out, err = cli(capsys, "recipe", "check", *files)
    assert rc == 2      # the worst: an unreadable file is a mistake, over a refused recipe
    assert err.splitlines() == [f"sfc-host: error: cannot read {files[0]}: No such file or "
                                "directory", f"sfc-host: error: {files[2]} is a folder, not a "
                                "recipe file"]
    assert [ln.split(": ")[0] for ln in out.splitlines() if ": SFC" not in ln] == [
        files[1], files[3], files[4]]
    assert f"{files[3]}: refused, 6 problems" in out and f"{files[4]}: ok, recipe" in out
    rc, out, _ = cli(capsys, "recipe", "check", *files[1:2], *files[3:])
    assert rc == 1


def test_check_json_is_one_document_with_the_unreadable_files(capsys, tmp_path: Path) -> None:
    files = [str(tmp_path / "missing.json"), str(REF / "axle_fit_qa.json"), str(tmp_path)]
    rc, out, err = cli(capsys, "recipe", "check", "--json", *files)
    assert rc == 2 and err == ""
    doc = json.loads(out)
    assert [d["file"] for d in doc] == files and [d["ok"] for d in doc] == [False, True, False]
    assert doc[0]["error"].startswith("cannot read") and "folder" in doc[2]["error"]
    assert "problems" not in doc[0] and doc[1]["steps"] == 6


def test_check_with_an_unknown_dataschema_flag_is_a_mistake(capsys, tmp_path: Path) -> None:
    f = tmp_path / "bare.json"
    f.write_text(json.dumps(linear(3)))
    rc, out, err = cli(capsys, "recipe", "check", "--dataschema", "9.9.9", str(f))
    assert rc == 2 and out == "" and err.count("\n") == 1 and "--dataschema '9.9.9'" in err


def test_version(capsys) -> None:
    from sfc_host.versions import package_version

    rc, out, _ = cli(capsys, "--version")
    assert rc == 0 and out == f"sfc-host (sfc-fast) {package_version()}\n"
    rc, out, _ = cli(capsys, "version")
    names = [ln.split()[0] for ln in out.splitlines()]
    assert rc == 0 and names == ["sfc-fast", "python", "redis-py", "hiredis", "uvloop",
                                 "sfc_fast"]
    assert "not installed" not in out
    rc, out, _ = cli(capsys, "version", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["sfc-fast"] == package_version()
    # the core of this checkout is built: its modules are extensions, not Python files
    assert doc["sfc_fast"]["compiled"] and doc["sfc_fast"]["extension"].startswith("cpython-")


def test_check_of_a_folder_is_a_usage_error(capsys, tmp_path: Path) -> None:
    rc, _, err = cli(capsys, "recipe", "check", str(tmp_path))
    assert rc == 2 and "folder" in err


def test_diagram_prints_a_mermaid_flowchart(capsys) -> None:
    rc, out, _ = cli(capsys, "recipe", "diagram", str(REF / "axle_fit_qa.json"))
    assert rc == 0
    assert out.startswith("flowchart TD\n")
    for step in ("Init", "Positioning", "TightenBolts", "QaCheck", "VerifyTorque",
                 "Complete"):
        assert f'"{step}' in out
    assert 'subgraph g0["FitAndQa (simultaneous)"]' in out
    assert '-->|"torque_ok"|' in out
    assert "b0 ==> s1" in out and "b0 ==> s3" in out   # fork to both paths
    assert "s2 --> j0" in out and "s3 --> j0" in out   # both paths join
    assert "j0 --> s4" in out                           # exit after the join


def test_diagram_labels_conditions_with_priority(capsys) -> None:
    rc, out, _ = cli(capsys, "recipe", "diagram", str(REF / "tighten_rework.json"))
    assert rc == 0
    assert '-->|"tighten.torque #gt;= 80 and tighten.torque #lt;= 90"|' in out
    assert '-->|"tighten._round #lt; 3 [1]"|' in out


def test_diagram_of_a_bad_recipe_is_one_line_and_exit_2(capsys) -> None:
    rc, out, err = cli(capsys, "recipe", "diagram", str(REF / "bad_two_initial.json"))
    assert rc == 2 and out == "" and "SFC001" in err and "6 problems" in err
    assert len(err.strip().splitlines()) == 1


def _console_script() -> str | None:
    cand = Path(sys.executable).parent / "sfc-host"
    return str(cand) if cand.exists() else None


def test_console_script_is_installed_and_runs() -> None:
    script = _console_script()
    if script is None:
        if in_ci():
            pytest.fail("sfc-host console script is not installed next to the interpreter")
        pytest.skip("package not installed (running from a source tree)")
    p = subprocess.run([script, "recipe", "check", str(REF / "axle_fit_qa.json")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "ok, recipe v1.0.0" in p.stdout


def test_python_dash_m_runs_the_cli() -> None:
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-m", "sfc_host", "recipe", "nope"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1
