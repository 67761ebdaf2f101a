"""Run with SGLang's python (tests/unit/test_sglang_contract.py does): checks rlfleet's request bodies against
SGLang 0.5.23's own request types, and prints answers built with SGLang's own response types.

stdin: {"requests": [{"path": "/generate", "body": {...}}, ...], "real_answers": [...], "schema_only": false}
stdout (last line): {"errors": [...], "answers": {"stop": {...}, "length": {...}, "abort": {...}}, "decoded": [...]}
schema_only: check /generate bodies with the generated schema types only (sglang.api.v1.api_types, loaded from its
file: a second, not a minute, since `import sglang` is heavy); real_answers: server answers decoded with them.
A body fails when the server's parser refuses it or when it carries a key the server's type does not have (FastAPI
would silently drop it: the msgspec request types ignore unknown keys), or a value does not come through unchanged.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any


def load_api_types() -> Any:
    """sglang.api.v1.api_types (generated, needs only msgspec) without running sglang/__init__."""
    spec_sglang = importlib.util.find_spec("sglang")
    assert spec_sglang is not None and spec_sglang.submodule_search_locations
    path = Path(spec_sglang.submodule_search_locations[0]) / "api" / "v1" / "api_types.py"
    spec = importlib.util.spec_from_file_location("sglang_api_v1_api_types", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module                          # msgspec resolves the annotations through it
    spec.loader.exec_module(module)
    return module


API = load_api_types()


def _io_types() -> dict[str, Any]:
    from sglang.srt.managers import io_struct as io

    return {
        "/abort_request": io.AbortReq,
        "/pause_generation": io.PauseGenerationReqInput,
        "/continue_generation": io.ContinueGenerationReqInput,
        "/begin_weight_update": io.BeginWeightUpdateReqInput,
        "/end_weight_update": io.EndWeightUpdateReqInput,
        "/update_weights_from_disk": io.UpdateWeightFromDiskReqInput,
        "/init_weights_update_group": io.InitWeightsUpdateGroupReqInput,
        "/update_weights_from_distributed": io.UpdateWeightsFromDistributedReqInput,
        "/destroy_weights_update_group": io.DestroyWeightsUpdateGroupReqInput,
        "/get_weights_by_name": io.GetWeightsByNameReqInput,
        "/flush_cache": None,
    }


def check_generate(body: dict[str, Any], schema_only: bool) -> list[str]:
    errors: list[str] = []
    try:
        API.GenerateRequest.from_json_value(body)          # the server's /generate contract gate
    except API.JsonContractError as exc:
        errors.append(f"/generate contract: {exc}")
    if schema_only:
        return errors
    from sglang.srt.managers.io_struct import GenerateReqInput

    known = {f.name for f in dataclasses.fields(GenerateReqInput)}
    errors += [f"/generate: key '{k}' is not a GenerateReqInput field" for k in body if k not in known]
    try:
        GenerateReqInput(**body)
    except Exception as exc:  # noqa: BLE001
        errors.append(f"/generate GenerateReqInput: {exc}")
    return errors


def check_struct(path: str, cls: Any, body: dict[str, Any]) -> list[str]:
    import msgspec
    from pydantic import TypeAdapter

    known = {f.name for f in msgspec.structs.fields(cls)}
    errors = [f"{path}: key '{k}' is not a {cls.__name__} field" for k in body if k not in known]
    try:
        obj = TypeAdapter(cls).validate_python(body)         # what FastAPI's Body() does
    except Exception as exc:  # noqa: BLE001
        return [*errors, f"{path} {cls.__name__}: {exc}"]
    errors += [f"{path}: '{k}' became {getattr(obj, k)!r}" for k, v in body.items()
               if k in known and getattr(obj, k) != v]
    return errors


def answers() -> dict[str, Any]:
    t = API

    def answer(finish: Any, ids: list[int], spans: list[tuple[str, int, int]], version: str) -> dict[str, Any]:
        meta = t.GenerateMetaInfo(
            id="rid-1", prompt_tokens=3, completion_tokens=len(ids), finish_reason=finish,
            output_token_logprobs=[t.LogprobEntry(logprob=-0.25 * (i + 1), token_id=tok) for i, tok in enumerate(ids)],
            weight_version=version,
            weight_versions=[t.WeightVersionSpan(version=v, start=s, end=e) for v, s, e in spans])
        return t.GenerateResponse(text="", meta_info=meta, output_ids=ids).to_json_value()

    return {
        "stop": answer(t.FinishStop(matched=2), [5, 6, 2], [("3", 0, 3)], "3"),
        "length": answer(t.FinishLength(length=4), [7, 8, 9, 10], [("3", 0, 2), ("4", 2, 4)], "4"),
        "abort": answer(t.FinishAbort(message="aborted"), [11], [("default", 0, 1)], "default"),
    }


def main() -> None:
    data = json.load(sys.stdin)
    requests, schema_only = data.get("requests", []), bool(data.get("schema_only", False))
    types = _io_types() if not schema_only and any(r["path"] != "/generate" for r in requests) else {}
    errors: list[str] = []
    for r in requests:
        if r["path"] == "/generate":
            errors += check_generate(r["body"], schema_only)
        elif schema_only:
            continue
        elif r["path"] not in types:
            errors.append(f"{r['path']}: not a route rlfleet is checked for")
        elif types[r["path"]] is not None:
            errors += check_struct(r["path"], types[r["path"]], r["body"] or {})
    decoded = []
    for raw in data.get("real_answers", []):
        try:
            r = API.GenerateResponse.from_json_value(raw)
            decoded.append({"ids": list(r.output_ids or []), "n": len(r.meta_info.output_token_logprobs or [])})
        except API.JsonContractError as exc:
            errors.append(f"answer: {exc}")
    print(json.dumps({"errors": errors, "answers": answers(), "decoded": decoded}))


if __name__ == "__main__":
    main()
