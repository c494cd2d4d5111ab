"""The action IR's records: Op (a str enum) and the immutable Action; the array codes come from
the enum; the JSON contract hexicore.actions/1 does not change; the torch executor has one
handler per kind."""

from __future__ import annotations

import json
import pickle

import pytest

from hexicore.core.errors import HexicoreError
from hexicore.pipeline import arrays
from hexicore.pipeline.actions import from_arrays, COMM_OPS, COMPUTE_OPS, OPS, Action, ActionList, Op, parse_actions
from hexicore.pipeline.arrays import CODE, ActionArrays


def test_op_is_a_string_enum():
    assert tuple(Op) == OPS and len(OPS) == 10
    a = Action("SEND_F", 0, 3, 1)
    assert a.op is Op.SEND_F and a.op == "SEND_F" and "SEND_F" == a.op
    assert f"{a.op}" == str(a.op) == "SEND_F" and a.op[-1] == "F" and a.op.startswith("SEND")
    assert {"SEND_F": 1}[a.op] == 1 and {Op.SEND_F: 2}["SEND_F"] == 2  # same hash and equality
    assert json.dumps({"op": a.op}) == '{"op": "SEND_F"}'
    assert set(COMPUTE_OPS) == {o for o in Op if o.is_compute} and set(COMM_OPS) == {o for o in Op if o.is_comm}


def test_action_record_is_immutable_and_checked():
    a = Action("F", 0, 3)
    assert a == Action(Op.F, 0, 3) == Action(op="F", stage=0, mb=3) and hash(a) == hash(Action(Op.F, 0, 3))
    assert (a.op, a.stage, a.mb, a.peer) == (Op.F, 0, 3, None) and a.is_compute and not a.is_comm
    with pytest.raises(AttributeError):
        a.mb = 4
    assert a._replace(mb=4) == Action("F", 0, 4)
    for bad in ("X", None, "f", ["F"]):
        with pytest.raises(HexicoreError, match="unknown op") as err:
            Action(bad, 0, 0)
        assert err.value.field == "op" and "\n" not in str(err.value)
    with pytest.raises(HexicoreError, match="unknown op 'Z'"):
        a._replace(op="Z")
    assert pickle.loads(pickle.dumps(a)) == a and pickle.loads(pickle.dumps(a)).op is Op.F
    assert repr(Action("STEP")) == "Action(op='STEP', stage=None, mb=None, peer=None)"
    assert [str(x) for x in (a, Action("RECV_B", 1, 2, 0), Action("REDUCE", 2, None, 1), Action("STEP"))] == \
        ["0F3", "1RECV_B2<-0", "2REDUCE", "STEP"]


#: an action list in the hexicore.actions/1 JSON exactly as the object-based IR wrote it
GOLDEN = ('{"format": "hexicore.actions/1", "schedule": {"name": "hand"}, "ranks": 2, "stages": 2, '
          '"micro_batches": 1, "stage_rank": [0, 1], "actions": [[{"op": "F", "stage": 0, "mb": 0}, '
          '{"op": "SEND_F", "stage": 0, "mb": 0, "peer": 1}, {"op": "RECV_B", "stage": 0, "mb": 0, "peer": 1}, '
          '{"op": "B", "stage": 0, "mb": 0}, {"op": "STEP"}], [{"op": "RECV_F", "stage": 1, "mb": 0, "peer": 0}, '
          '{"op": "F", "stage": 1, "mb": 0}, {"op": "I", "stage": 1, "mb": 0}, '
          '{"op": "SEND_B", "stage": 1, "mb": 0, "peer": 0}, {"op": "W", "stage": 1, "mb": 0}, '
          '{"op": "REDUCE", "stage": 1, "peer": 0}, {"op": "STEP"}]]}')


def test_json_is_byte_identical_and_parses_to_members(tmp_path):
    al = parse_actions(json.loads(GOLDEN))
    assert al.to_json() == GOLDEN
    assert all(type(a.op) is Op for acts in al.actions for a in acts)
    assert ActionList.load(al.save(tmp_path / "a.json")) == al
    assert (tmp_path / "a.json").read_text() == GOLDEN + "\n"
    bad = json.loads(GOLDEN)
    bad["actions"][1][2]["op"] = "BACKWARD"
    with pytest.raises(HexicoreError, match="unknown op 'BACKWARD'") as err:
        parse_actions(bad, "x.json")
    assert (err.value.source, err.value.field) == ("x.json", "actions[1][2].op")


@pytest.mark.parametrize("key, value, field, words", [
    ("chains", 0, "chains", "expected a list"),
    ("chains", False, "chains", "expected a list"),
    ("chains", [], "chains", "needs at least one chain"),
    ("chains", [[0, "1"]], "chains[0][1]", "expected an integer"),
    ("mb_chain", False, "mb_chain", "expected a list"),
    ("mb_chain", "", "mb_chain", "expected a list"),
    ("mb_chain", [], "mb_chain", "needs 1 chain indices"),
    ("mb_chain", [-1], "mb_chain[0]", ">= 0"),
])
def test_optional_chains_given_wrong_are_refused_not_taken_for_absent(key, value, field, words):
    bad = json.loads(GOLDEN)
    bad[key] = value
    with pytest.raises(HexicoreError, match=words) as err:
        parse_actions(bad, "x.json")
    assert (err.value.source, err.value.field) == ("x.json", field)


@pytest.mark.parametrize("key", ["chains", "mb_chain"])
def test_optional_chains_absent_or_null_are_the_defaults(key):
    data = json.loads(GOLDEN)
    data[key] = None
    al = parse_actions(data)
    assert al.chains == ((0, 1),) and al.mb_chain == (0,) and al == parse_actions(json.loads(GOLDEN))


def test_array_codes_agree_with_the_enum():
    assert [CODE[o] for o in Op] == list(range(len(Op))) and CODE["RECV_F"] == CODE[Op.RECV_F]
    assert (arrays.F, arrays.SEND_F, arrays.RECV_B, arrays.STEP) == (CODE[Op.F], CODE[Op.SEND_F], CODE[Op.RECV_B],
                                                                      CODE[Op.STEP])
    al = parse_actions(json.loads(GOLDEN))
    arr = ActionArrays.from_lists(al.actions)
    assert [OPS[c] for c in arr.op.tolist()] == [a.op for acts in al.actions for a in acts]
    assert arr.is_comm().tolist() == [a.is_comm for acts in al.actions for a in acts]
    back = from_arrays(arr)
    assert back == al.actions and all(type(a.op) is Op for acts in back for a in acts)


def test_executor_dispatches_every_kind_through_its_table():
    pytest.importorskip("torch")
    from hexicore_plugins.runtimes.torch.parallel.pipeline import HANDLERS, Executor

    assert set(HANDLERS) == set(Op)
    assert HANDLERS[Op.B] is HANDLERS[Op.I] is HANDLERS[Op.W] is Executor._on_backward

    class Probe(Executor):
        def __init__(self):  # only the dispatch, no stages or process groups
            self.seen = []

        def _forward(self, st, mb):
            self.seen.append(("forward", st, mb))

    probe = Probe()
    probe.stages = {2: "stage2"}
    probe._execute(0, Action("F", 2, 5))
    assert probe.seen == [("forward", "stage2", 5)]
