"""The results file: its JSON schema, validation and atomic writing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema

SCHEMA_VERSION = 1
RESULTS_DIR = Path(__file__).resolve().parent / "results"

_COMPARISON = {
    "type": "object",
    "required": ["metric", "baseline", "repeats", "order", "contenders", "ratios"],
    "properties": {
        "metric": {"type": "string"},
        "baseline": {"type": "string"},
        "repeats": {"type": "integer", "minimum": 1},
        "order": {"type": "array", "items": {"type": "string"}},
        "contenders": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["config", "samples", "median", "runs"],
                "properties": {
                    "config": {"type": "object"},
                    "samples": {"type": "array", "items": {"type": "number"}, "minItems": 1},
                    "median": {"type": "number"},
                    "runs": {"type": "array", "items": {"type": "object"}},
                },
            },
        },
        "ratios": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["per_repeat", "median"],
                "properties": {"per_repeat": {"type": "array", "items": {"type": "number"}},
                               "median": {"type": "number"}},
            },
        },
    },
}

# The run that measured a section, and the section's own time span and load: a run of some sections
# keeps the other sections of the file it replaces (merge), each with the run that measured it.
_MEASURED = {
    "type": "object",
    "required": ["command", "run_started_at", "started_at", "finished_at", "load_avg", "cpu_model"],
    "properties": {"command": {"type": "string"}, "run_started_at": {"type": "string"},
                   "started_at": {"type": "string"}, "finished_at": {"type": "string"},
                   "load_avg": {"type": "array"}, "load_avg_end": {"type": ["array", "null"]},
                   "cpu_model": {"type": "string"}},
}

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["schema_version", "name", "command", "quick", "started_at", "finished_at", "machine",
                 "versions", "sections"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]*$"},
        "command": {"type": "string"},
        "quick": {"type": "boolean"},
        "started_at": {"type": "string"},
        "finished_at": {"type": "string"},
        "machine": {
            "type": "object",
            "required": ["cores", "cpu_model", "load_avg"],
            "properties": {"cores": {"type": "integer", "minimum": 1}, "cpu_model": {"type": "string"},
                           "load_avg": {"type": "array"}},
        },
        "versions": {
            "type": "object",
            "required": ["python", "torch", "horovod"],
        },
        "sections": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["status"],
                "properties": {
                    "status": {"enum": ["ok", "skipped", "failed"]},
                    "reason": {"type": "string"},
                    "comparison": _COMPARISON,
                    "measured": _MEASURED,
                },
                "if": {"properties": {"status": {"enum": ["skipped", "failed"]}}},
                "then": {"required": ["status", "reason"]},
            },
        },
    },
}


def validate(results: dict) -> None:
    """Raise jsonschema.ValidationError when `results` does not match the schema."""
    jsonschema.validate(results, SCHEMA)


# Per-step samples: what the figures are computed from, not what the report shows, and most of a full
# run's bytes. They go to <name>.raw.json (not committed, see .gitignore) only when asked for
# (`scripts/bench --raw`).
RAW_KEYS = frozenset({"step_durations_s"})


def summary(value):
    """`value` without the raw samples (RAW_KEYS at any depth): what is committed and reported."""
    if isinstance(value, dict):
        return {k: summary(v) for k, v in value.items() if k not in RAW_KEYS}
    if isinstance(value, list):
        return [summary(v) for v in value]
    return value


def measured_by(results: dict) -> dict:
    """A section's `measured` record when it has none: the whole run's span and load (documents from
    before sections carried their own)."""
    m = results["machine"]
    return {"command": results["command"], "run_started_at": results["started_at"],
            "started_at": results["started_at"], "finished_at": results["finished_at"],
            "load_avg": m["load_avg"], "load_avg_end": m.get("load_avg_end"), "cpu_model": m["cpu_model"]}


def merge(previous: dict | None, current: dict) -> tuple[dict, list[str]]:
    """What a run writes over the file `previous` held: `current`'s sections, and previous's other
    sections, kept with the run that measured them, so a run of some sections loses none of the
    others' figures. Returns the document and the names of the sections kept. A quick run's figures
    and a full run's are never mixed: then `current` alone (nothing kept)."""
    if not previous or previous.get("schema_version") != SCHEMA_VERSION or \
            previous.get("quick") != current["quick"]:
        return current, []
    old = {name: sec if "measured" in sec else {**sec, "measured": measured_by(previous)}
           for name, sec in previous["sections"].items()}
    kept = [name for name in old if name not in current["sections"]]
    # previous's order, each measured section in its place; sections new to the file at the end
    merged = {name: current["sections"].get(name, sec) for name, sec in old.items()}
    merged.update(current["sections"])
    return {**current, "sections": merged}, kept


def read_previous(path: Path) -> dict | None:
    """The results file a run is about to replace, or None when there is none or it cannot be read
    (it is then replaced whole; the run says so)."""
    try:
        doc = json.loads(path.read_text())
        validate(doc)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, jsonschema.ValidationError) as e:
        raise ValueError(f"{path}: not a results file ({str(e).splitlines()[0]})") from None
    return doc


def write(results: dict, directory: Path = RESULTS_DIR, raw: bool = False) -> Path:
    """Validate, then write the summary to <directory>/<name>.json and, with `raw`, everything to
    <name>.raw.json, each atomically (a crash never leaves half a file)."""
    validate(results)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{results['name']}.json"
    _write_atomically(path, summary(results))
    if raw:
        _write_atomically(raw_path(path), results)
    return path


def raw_path(path: Path) -> Path:
    """bench/results/latest.json -> bench/results/latest.raw.json."""
    return path.with_suffix(".raw.json")


def _write_atomically(path: Path, value) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(to_json(value) + "\n")
    os.replace(tmp, path)


def to_json(value, depth: int = 0) -> str:
    """JSON with one key per line, except that a list of scalars, or of lists of scalars, stays on one
    line: the raw samples (thousands of per-step durations a run) would take a line per number."""
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict) and value:
        items = ",\n".join(f"{inner}{json.dumps(str(k))}: {to_json(v, depth + 1)}" for k, v in value.items())
        return "{\n" + items + "\n" + pad + "}"
    if isinstance(value, list) and not all(_flat(v) for v in value):
        items = ",\n".join(inner + to_json(v, depth + 1) for v in value)
        return "[\n" + items + "\n" + pad + "]"
    return json.dumps(value)


def _flat(value) -> bool:
    """A scalar, or a list (or empty dict) of scalars."""
    if isinstance(value, list):
        return all(not isinstance(v, list | dict) for v in value)
    return not isinstance(value, dict) or not value
