"""The claim registry and the claim specs: one module per claim, each opening with a spec whose
predictions all carry a role, a rule kind and the origin of their numbers; the claim list and the
families each claim trains are derived from the specs."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import normlab.study.claims as registry
from normlab.study.claims.spec import ROLES, RULE_KINDS, Claim, PredictionSpec, Rule
from normlab.study.verdict import predict_band, predict_direction, predict_setting


def test_every_claim_module_is_registered_once_in_claim_order():
    names = sorted(m.name for m in pkgutil.iter_modules(registry.__path__)
                   if m.name.startswith("c") and m.name[1:3].isdigit())
    assert [m.__name__.rsplit(".", 1)[1] for m in registry.MODULES] == names
    assert tuple(m.CLAIM.id for m in registry.MODULES) == registry.ALL_CLAIMS
    assert list(registry.ALL_CLAIMS) == sorted(
        registry.ALL_CLAIMS, key=lambda cid: (int(cid[1:].rstrip("ab")), cid))
    assert {"C1", "C6a", "C6b", "C14"} <= set(registry.ALL_CLAIMS)
    for name in names:  # the module's name starts with its claim's number
        claim = importlib.import_module(f"normlab.study.claims.{name}").CLAIM
        assert name.startswith(f"c{int(claim.id[1:].rstrip('ab')):02d}")
        assert claim.measure is not None and registry.measures()[claim.id] is claim.measure


def test_every_claim_has_its_own_test_file():
    """tests/study/claims/test_cNN.py tests claim NN (C6a and C6b share test_c06.py)."""
    folder = Path(__file__).parent / "claims"
    wanted = {f"test_{m.__name__.rsplit('.', 1)[1][:3]}.py" for m in registry.MODULES}
    assert wanted == {p.name for p in folder.glob("test_c*.py")}


@pytest.mark.parametrize("cid", registry.ALL_CLAIMS)
def test_each_spec_states_its_source_setting_and_every_prediction_s_role_rule_and_origin(cid):
    claim = registry.REGISTRY[cid]
    for text in (claim.title, claim.statement, claim.source, claim.quote, claim.setting):
        assert text.strip(), f"{cid}: a spec field is empty"
    assert claim.predictions
    assert len({p.key for p in claim.predictions}) == len(claim.predictions)
    for p in claim.predictions:
        assert p.role in ROLES and p.rule.kind in RULE_KINDS
        assert p.rule.origin.strip(), f"{cid} {p.key}: no origin for the rule's numbers"
        assert p.quantity.strip() and p.paper.strip()


def test_the_families_each_claim_trains_come_from_the_specs():
    by_claim = registry.trained_by_claim()
    # C9's families under the wsd schedule (docs/study.md, C9, sixth round)
    assert by_claim["C9"] == (("pre_wsd", True), ("post_wsd", True), ("pre_xavier_wsd", True),
                              ("post_gpt2_wsd", True))
    assert by_claim["C7"] == (("post", False),)
    assert "C4" not in by_claim and "C8" not in by_claim  # at init: nothing trained
    assert by_claim["C1"] == (("pre", True), ("post", True))  # its trained diagnostic
    assert set(by_claim) == {c.id for c in registry.REGISTRY.values() if c.trains}


def _claim(*predictions: PredictionSpec) -> Claim:
    return Claim("C0", "t", "s", "src", "q", "set", "paper", predictions)


def test_predict_decides_the_declared_rule_as_the_verdict_functions_do():
    claim = _claim(
        PredictionSpec("pre", "q", "p", Rule("direction", "<", 0.5, origin="o")),
        PredictionSpec("post", "q", "p", Rule("band", low=1.0, high=2.0, origin="b")),
        PredictionSpec("{lr}", "q", "p", Rule("direction", ">", origin="rung"),
                       role="premise"))
    vals = [0.1, 0.2, 0.3]
    got = claim.predict("pre", vals)
    want = predict_direction("pre", "q", "p", vals, "<", 0.5, 0.0, threshold_source="o")
    assert got.to_dict() == want.to_dict()
    band = claim.predict("post", [1.4, 1.5, 1.6], subject="post, L=6")
    assert band.to_dict() == predict_band("post, L=6", "q", "p", [1.4, 1.5, 1.6], 1.0, 2.0,
                                          threshold_source="b").to_dict()
    assert claim.predict("post", [1.4, 1.5], low=1.45).effect.expected == "in [1.45, 2]"
    rung = claim.predict("{lr}", [1.0, 2.0], threshold=0.25, subject="lr 1e-3")
    assert rung.role == "premise" and rung.effect.expected == "> 0.25"
    assert rung.subject == "lr 1e-3" and rung.threshold_source == "rung"
    facts = _claim(PredictionSpec("large t", "q", "p", Rule("setting", ">", 6.0, origin="s"),
                                  role="premise", scale=True),
                   PredictionSpec("matched", "q", "p", Rule("setting", "<=", origin="m"),
                                  role="premise"))
    deep = facts.predict("large t", [7.0])
    assert deep.to_dict() == predict_setting("large t", "q", "p", [7.0], ">", 6.0,
                                             threshold_source="s").to_dict() | {"scale": True}
    assert facts.predict("large t", [4.0]).verdict == "not supported"
    gap = facts.predict("matched", [0.05], threshold=0.05)
    assert (gap.verdict, gap.kind, gap.scale) == ("supported", "setting", False)
    with pytest.raises(ValueError, match="C0 matched: a setting rule needs its threshold"):
        facts.predict("matched", [0.05])


def test_a_spec_refuses_what_it_does_not_declare():
    claim = _claim(PredictionSpec("pre", "q", "p", Rule("direction", ">", origin="o")))
    with pytest.raises(KeyError, match="C0 declares no prediction 'post' \\(declared: pre\\)"):
        claim.predict("post", [1.0, 2.0])
    with pytest.raises(ValueError, match="C0 pre: a direction rule needs its threshold"):
        claim.predict("pre", [1.0, 2.0])
    with pytest.raises(ValueError, match="rule kind 'bound' is not one of"):
        Rule("bound", origin="o")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a direction rule needs expected '>' or '<'"):
        Rule("direction", threshold=0.0, origin="o")
    with pytest.raises(ValueError, match="a setting rule needs expected one of >, <, >=, <="):
        Rule("setting", "==", 6.0, origin="o")
    with pytest.raises(ValueError, match="role 'test' is not one of claim, premise, diagnostic"):
        PredictionSpec("pre", "q", "p", Rule("direction", ">", 0.0), role="test")  # type: ignore
    band = _claim(PredictionSpec("pre", "q", "p", Rule("band", low=0.0, origin="o")))
    with pytest.raises(ValueError, match="C0 pre: a band needs its edges"):
        band.predict("pre", [1.0, 2.0])


def test_docs_study_md_and_the_readme_say_what_the_specs_and_study_json_say():
    """docs/study.md's claim table comes from the specs, the README's findings and tables from
    the recorded study.json files: `python scripts/study_docs.py` writes them."""
    import runpy
    from pathlib import Path

    script = Path(__file__).parents[2] / "scripts" / "study_docs.py"
    main = runpy.run_path(str(script))["main"]
    assert main(["--check"]) == 0, "run python scripts/study_docs.py"


def test_each_finding_is_one_plain_line_from_the_claim_s_numbers():
    from normlab.study.table import finding

    def pred(subject, verdict, est, role="claim", expected="> 0"):
        return {"subject": subject, "verdict": verdict, "role": role,
                "effect": {"estimate": est, "ci_low": est - 0.1, "ci_high": est + 0.1,
                           "n": 4, "expected": expected}}

    held = {"id": "C9", "title": "t", "verdict": "supported",
            "predictions": [pred("post", "supported", 0.5), pred("d", "not supported", -1.0,
                                                                  role="diagnostic")]}
    assert finding(held) == "**C9** t: holds: post +0.5 [+0.4, +0.6] (expected > 0)"
    refuted = held | {"verdict": "not supported",
                      "predictions": [pred("pre", "supported", 0.5),
                                      pred("post", "not supported", -0.5)]}
    assert finding(refuted) == "**C9** t: does not hold: post -0.5 [-0.6, -0.4] (expected > 0)"
    scale = held | {"verdict": "not tested at this scale", "needs": "longer runs",
                    "predictions": [pred("converged", "not supported", 0.3, role="premise",
                                         expected="< 0.02"), pred("post", "supported", 0.5)]}
    assert finding(scale) == ("**C9** t: not tested here: converged +0.3 [+0.2, +0.4] (expected "
                              "< 0.02); needs longer runs")
    open_ = held | {"verdict": "inconclusive", "predictions": [pred("post", "inconclusive",
                                                                    0.05)]}
    assert finding(open_).startswith("**C9** t: undecided: post +0.05")
    premise = pred("large t", "not supported", 4.0, role="premise", expected="> 6")
    premise |= {"kind": "setting", "values": [4.0]}
    short = held | {"verdict": "not tested at this scale", "needs": "12 blocks",
                    "predictions": [premise, pred("post", "supported", 0.5)]}
    assert finding(short) == "**C9** t: not tested here: large t 4 (expected > 6); needs 12 blocks"
    ladder = refuted | {"departure": "pre departs when mlp changed (mlp)"}
    assert finding(ladder).endswith("; along the ladder: pre departs when mlp changed (mlp)")
    # a prediction evaluated with each rung's own quantities (C4's pre on normlab's block):
    # the line says it holds as the mechanism predicts, not as the source's law
    own = pred("pre", "supported", -0.03) | {
        "derivation": "on every rung from that rung's own measured E||x_L||^2 slope"}
    mechanism = held | {"predictions": [pred("post", "supported", 0.04), own]}
    assert finding(mechanism).endswith(
        "; off the source's setting these are the source's mechanism with each rung's own "
        "quantities, not its law: pre (on every rung from that rung's own measured "
        "E\\|\\|x_L\\|\\|^2 slope)")
    plain = held | {"predictions": [pred("post", "supported", 0.04) | {
        "derivation": "the bound's exponent 0 on every rung"}]}
    assert "mechanism" not in finding(plain)


def test_a_resumed_study_records_each_part_and_the_total(tmp_path):
    import json

    from normlab.study.runner import _earlier_parts
    from normlab.study.table import study_header

    path = tmp_path / "study.json"
    assert _earlier_parts(path, "quick") == []
    path.write_text(json.dumps({"profile": "quick", "created": "a", "git_commit": "1234567abc",
                                "elapsed_s": 120.0}))
    first = _earlier_parts(path, "quick")
    assert first == [{"started": "a", "git_commit": "1234567abc", "elapsed_s": 120.0,
                      "claims": None}]
    assert _earlier_parts(path, "standard") == []
    study = {"profile": "quick", "parts": [*first, {"started": "b", "git_commit": "89abcdef",
                                                     "elapsed_s": 60.0}],
             "machine": "cpu", "torch": "2.13"}
    assert study_header(study).startswith(
        "Profile `quick`: 3.0 min in 2 parts (2.0 min from a at commit `1234567`; 1.0 min from "
        "b at commit `89abcde`)")
