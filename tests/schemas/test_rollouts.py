"""The return path's wire format: prompt and rollout records round-trip, and every bad field is refused by name."""
import dataclasses
import math

import msgpack
import pytest
import zstandard

from hilo.replay.bad_records import reason_of
from hilo.schemas.errors import LimitExceeded, MalformedMessage, NonFinite
from hilo.schemas.framing import KIND_ROLLOUT, frame
from hilo.schemas.limits import Limits
from hilo.schemas.records import decode_record
from hilo.schemas.rollouts import PromptRecord, RolloutRecord, Sampling, decode_rollout_record
from hilo.schemas.signing import Signer, SignatureError, generate

PROMPT = PromptRecord("exp1", "p-000017", (151644, 872, 198, 17, 10, 18), Sampling(4, 1.0, 0.95, 16, 7), 12)
ROLLOUT = RolloutRecord("exp1", "p-000017", 3, "eu-1", 12, 13, (20, 151645), (-0.25, -0.5), 1.0,
                        "hilo.ops.digits:reward",
                        "stop", {"queued_s": 0.01, "generate_s": 0.4})


def body_of(record) -> dict:
    """The msgpack body of an unsigned record (to mutate one field)."""
    data = record.to_bytes()
    return msgpack.unpackb(zstandard.ZstdDecompressor().decompress(data[16:]), raw=False)


def test_both_records_round_trip_bit_for_bit():
    assert decode_rollout_record(PROMPT.to_bytes(), "p") == PROMPT
    assert decode_rollout_record(ROLLOUT.to_bytes(), "r") == ROLLOUT  # log-probabilities exact in float32 here
    assert ROLLOUT.to_bytes() == ROLLOUT.to_bytes()  # deterministic bytes


@pytest.mark.parametrize("field,value,error,words", [
    ("logprobs", b"\x00" * 4, MalformedMessage, "field 'logprobs' is 4 bytes, expected 8"),
    ("logprobs", b"\x00\x00\xc0\x7f" * 2, NonFinite, "field 'logprobs' has a non-finite value at token 0"),
    ("logprobs", b"\x00\x00\x80\x3f" * 2, MalformedMessage, "not a log-probability"),
    ("reward", math.nan, NonFinite, "field 'reward' = nan is not finite"),
    ("reward", math.inf, NonFinite, "field 'reward' = inf is not finite"),
    ("version_end", 11, MalformedMessage, "field 'version_end' = 11 is outside [12,"),
    ("sample", 1024, MalformedMessage, "field 'sample' = 1024 is outside [0, 1023]"),
    ("finish_reason", "eos", MalformedMessage, "field 'finish_reason' = 'eos'"),
    ("completion_ids", b"\x01\x02\x03", MalformedMessage, "not a whole number of uint32 token ids"),
    ("timings", {"generate_s": -1.0}, MalformedMessage, "field 'timings' must map names to seconds >= 0"),
    ("site", "", MalformedMessage, "field 'site' must be 1..128 bytes"),
])
def test_a_bad_rollout_field_is_refused_by_name(field, value, error, words):
    body = body_of(ROLLOUT) | {field: value}
    with pytest.raises(error, match="rollout record.*prompt p-000017 sample 3|rollout record") as e:
        decode_rollout_record(frame(KIND_ROLLOUT, body), "RUN.rollouts offset 9")
    assert words in str(e.value) and "RUN.rollouts offset 9" in str(e.value)
    if error is NonFinite:
        assert reason_of(e.value) == "non-finite"  # what a reader counts it as


@pytest.mark.parametrize("change,words", [
    ({"sampling": {"n": 0, "temperature": 1.0, "top_p": 1.0, "max_tokens": 8, "seed": 0}},
     "field 'n' = 0 is outside [1, 1024]"),
    ({"sampling": {"n": 2, "temperature": -0.5, "top_p": 1.0, "max_tokens": 8, "seed": 0}},
     "field 'temperature' = -0.5 must be >= 0"),
    ({"sampling": {"n": 2, "temperature": 1.0, "top_p": 0.0, "max_tokens": 8, "seed": 0}},
     "field 'top_p' = 0.0 must be in (0, 1]"),
    ({"token_ids": b""}, "field 'token_ids' is empty"),
    ({"min_version": -1}, "field 'min_version' = -1 is outside"),
])
def test_a_bad_prompt_field_is_refused_by_name(change, words):
    from hilo.schemas.framing import KIND_PROMPT
    with pytest.raises(MalformedMessage) as e:
        decode_rollout_record(frame(KIND_PROMPT, body_of(PROMPT) | change), "RUN.prompts offset 4")
    assert words in str(e.value) and "prompt p-000017" in str(e.value)


def test_limits_bound_tokens_before_anything_is_built():
    small = Limits(max_prompt_tokens=4, max_completion_tokens=1)
    with pytest.raises(LimitExceeded, match="field 'token_ids' holds 6 tokens > limit 4"):
        decode_rollout_record(PROMPT.to_bytes(), "p", small)
    with pytest.raises(LimitExceeded, match="field 'completion_ids' holds 2 tokens > limit 1"):
        decode_rollout_record(ROLLOUT.to_bytes(), "r", small)
    with pytest.raises(LimitExceeded):  # a body over max_rollout_bytes is refused before decompression
        decode_rollout_record(ROLLOUT.to_bytes(), "r", Limits(max_rollout_bytes=64))


def test_the_two_paths_refuse_each_others_records():
    with pytest.raises(MalformedMessage, match="a rollout record where a policy record"):
        decode_record(ROLLOUT.to_bytes(), "RUN.updates offset 3")
    from hilo.schemas.records import KeyRotation
    with pytest.raises(MalformedMessage, match="a policy record \\(kind 3\\) where a prompt or rollout record belongs"):
        decode_rollout_record(KeyRotation("exp1", 4, bytes(32)).to_bytes(), "RUN.rollouts offset 3")


def test_a_site_signs_its_rollouts(tmp_path):
    private, public = generate(str(tmp_path / "site"))
    other, _ = generate(str(tmp_path / "other"))
    from hilo.schemas.framing import split_trailer
    from hilo.schemas.signing import Verifier
    data = ROLLOUT.to_bytes(Signer.load(str(private)))
    Verifier.load(str(public)).verify(*split_trailer(data, "r"), "r")
    assert decode_rollout_record(data, "r").prompt_id == ROLLOUT.prompt_id
    forged = ROLLOUT.to_bytes(Signer.load(str(other)))
    with pytest.raises(SignatureError):
        Verifier.load(str(public)).verify(*split_trailer(forged, "r"), "r")


def test_what_served_a_rollout_is_optional_on_the_wire():
    """export_dtype and engine (the audit recomputes at that dtype) round-trip; a record without them has neither key,
    its bytes as before they existed, and decodes with None; a dtype no site exports is refused by name."""
    said = dataclasses.replace(ROLLOUT, export_dtype="bfloat16", engine="vllm 0.32.0")
    assert decode_rollout_record(said.to_bytes(), "r") == said
    assert {"export_dtype", "engine"}.isdisjoint(body_of(ROLLOUT)) and decode_rollout_record(ROLLOUT.to_bytes(),
                                                                                             "r").engine is None
    body = body_of(said) | {"export_dtype": "int8"}
    with pytest.raises(MalformedMessage, match="field 'export_dtype' = 'int8', expected one of"):
        decode_rollout_record(frame(KIND_ROLLOUT, body), "RUN.rollouts offset 9")
    with pytest.raises(MalformedMessage, match="field 'engine' must be 1..64 bytes"):
        decode_rollout_record(frame(KIND_ROLLOUT, body_of(said) | {"engine": "x" * 65}), "RUN.rollouts offset 9")
