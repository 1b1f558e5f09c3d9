"""The study's profiles: `Profile` holds the sizes several claims share, each claim its own
(`Settings`, one value per profile, in the claim's module), and study.json records both side by
side (`normlab.study.claims.profile_settings`)."""

from __future__ import annotations

import dataclasses

import pytest

from normlab.study.claims import REGISTRY, profile_settings, settings_owner, with_settings
from normlab.study.profiles import PROFILES, Profile

# the most fields `Profile` may hold: the sizes the claims share, not one claim's own
MAX_PROFILE_FIELDS = 30


def test_the_profile_keeps_only_the_shared_sizes():
    assert len(dataclasses.fields(Profile)) <= MAX_PROFILE_FIELDS


def test_each_claim_s_settings_are_a_frozen_dataclass_with_a_value_for_known_profiles_only():
    owners: dict[str, str] = {}
    shared = {f.name for f in dataclasses.fields(Profile)} | {"warmup"}
    for claim in REGISTRY.values():
        if claim.settings_class is None:
            assert not claim.per_profile, claim.id
            assert claim.settings(PROFILES["quick"]) is None
            continue
        assert dataclasses.is_dataclass(claim.settings_class)
        assert claim.settings_class.__dataclass_params__.frozen, claim.id
        assert set(claim.per_profile) <= set(PROFILES), claim.id
        for value in claim.per_profile.values():
            assert isinstance(value, claim.settings_class), claim.id
        for f in dataclasses.fields(claim.settings_class):
            # study.json records every claim's settings beside the shared sizes: one name, one
            # owner
            assert f.name not in shared and f.name not in owners, (claim.id, f.name)
            owners[f.name] = claim.id
    assert owners  # claims with sizes of their own exist


@pytest.mark.parametrize("name", list(PROFILES))
def test_study_json_records_the_shared_sizes_and_every_claim_s_settings(name):
    profile = PROFILES[name]
    recorded = profile_settings(profile)
    assert recorded["name"] == name and recorded["warmup"] == profile.warmup
    for claim in REGISTRY.values():
        own = claim.settings(profile)
        if own is not None:
            assert {k: recorded[k] for k in dataclasses.asdict(own)} == dataclasses.asdict(own)


def test_a_profile_sets_a_claim_s_settings_through_the_claim():
    c14 = REGISTRY["C14"]
    assert c14.settings(PROFILES["long"]).khop_depths == (2, 3)  # the claim's value for long
    assert c14.settings(PROFILES["quick"]) == c14.settings_class()  # none given: the defaults
    deeper = c14.with_settings(PROFILES["long"], khop_depths=(12, 24))
    assert c14.settings(deeper).khop_depths == (12, 24)
    assert c14.settings(deeper).khop_width == c14.settings(PROFILES["long"]).khop_width
    assert c14.settings(PROFILES["long"]).khop_depths == (2, 3)  # the profile itself unchanged
    # one call for shared sizes and claims' settings alike, each to its owner
    both = with_settings(PROFILES["tiny"], steps=16, c5_seeds=3, khop_steps=4)
    assert both.steps == 16 and settings_owner("steps") is None
    assert REGISTRY["C5"].settings(both).c5_seeds == 3 and settings_owner("c5_seeds").id == "C5"
    assert c14.settings(both).khop_steps == 4
    with pytest.raises(TypeError):
        with_settings(PROFILES["tiny"], no_such_setting=1)
