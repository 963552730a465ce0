"""publish() and remove(): one node's Scv created when missing, its status written only when the GPUs changed (SCV's
rule), its spec left to whoever set it unless forced, a half-made object undone, a conflict started over.

The client is an in-memory store that answers as kube-apiserver does for these five calls (a resourceVersion per
write, 409 for a write over a stale one, nothing stored in a dry run); the same code against a real API server is
in tests/integration/test_scv.py and test_agent_publishing.py.
"""

from __future__ import annotations

import copy

import pytest

from ansible_collections.scv.gpu.plugins.module_utils.kube.errors import ApiError
from ansible_collections.scv.gpu.plugins.module_utils.scv.publisher import publish, remove, write_status

CARD = {"id": 0, "uuid": "GPU-0", "model": "NVIDIA H100 80GB HBM3", "health": "Healthy", "totalMemory": 81559,
        "freeMemory": 81000, "usedMemory": 559, "clock": 1980, "bandwidth": 3352, "core": 132, "power": 700}


def facts(**changes):
    return {"cardList": [dict(CARD, **changes)]}


class Store:
    """Scvs by name; ``calls`` records (verb, name, dry run); ``fail`` maps a verb to the ApiErrors its next calls
    raise, one each."""

    def __init__(self):
        self.objects, self.calls, self.fail, self.version = {}, [], {}, 0

    def _write(self, verb, body, dry_run):
        self.calls.append((verb, body["metadata"]["name"], dry_run))
        if self.fail.get(verb):
            raise self.fail[verb].pop(0)
        name = body["metadata"]["name"]
        stored = self.objects.get(name)
        if verb != "create" and body["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
            raise ApiError("the object has been modified", conflict=True, status=409)
        self.version += 1
        kept = copy.deepcopy(body)
        if verb == "replace_status":
            kept = dict(copy.deepcopy(stored), status=kept.get("status"))
        elif stored is not None:
            kept["status"] = stored.get("status")
        kept["metadata"] = dict(kept["metadata"], resourceVersion=str(self.version), managedFields=[{"manager": "x"}])
        if not dry_run:
            self.objects[name] = kept
        return copy.deepcopy(kept)

    def get(self, name):
        self.calls.append(("get", name, False))
        return copy.deepcopy(self.objects.get(name))

    def create(self, body, dry_run=False):
        return self._write("create", body, dry_run)

    def replace(self, body, dry_run=False):
        return self._write("replace", body, dry_run)

    def replace_status(self, body, dry_run=False):
        return self._write("replace_status", body, dry_run)

    def delete(self, name, dry_run=False):
        self.calls.append(("delete", name, dry_run))
        if self.fail.get("delete"):
            raise self.fail["delete"].pop(0)
        if not dry_run:
            self.objects.pop(name)
        return True

    def writes(self):
        return [call[0] for call in self.calls if call[0] != "get"]


def test_a_missing_scv_is_created_with_its_interval_and_its_status_written():
    store = Store()
    done = publish(store, "gpu-1", facts(), 1000)
    assert (done["changed"], done["created"], done["status_updated"], done["spec_updated"]) == (True, True, True, False)
    assert store.writes() == ["create", "replace_status"]
    made = store.objects["gpu-1"]
    assert made["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "scv.gpu"}
    assert made["spec"] == {"updateInterval": 1000}
    assert [card["uuid"] for card in made["status"]["cardList"]] == ["GPU-0"] and made["status"]["updateTime"]
    assert done["before"] == {} and done["after"]["status"]["cardList"] == made["status"]["cardList"]
    assert "managedFields" not in done["scv"]["metadata"]


def test_the_status_is_written_only_when_the_gpus_changed():
    store = Store()
    publish(store, "gpu-1", facts(), 1000)
    written = store.objects["gpu-1"]["status"]["updateTime"]
    again = publish(store, "gpu-1", facts(), 1000)
    assert [again[key] for key in ("changed", "created", "spec_updated", "status_updated", "warnings")] == [
        False, False, False, False, []]
    assert store.writes() == ["create", "replace_status"]
    assert store.objects["gpu-1"]["status"]["updateTime"] == written
    used = publish(store, "gpu-1", facts(freeMemory=1000, usedMemory=80559), 1000)
    assert used["changed"] and used["status_updated"] and store.writes()[-1] == "replace_status"
    assert store.objects["gpu-1"]["status"]["cardList"][0]["freeMemory"] == 1000


def test_a_card_that_turned_unhealthy_moves_out_of_the_card_list():
    store = Store()
    publish(store, "gpu-1", facts(), 1000)
    publish(store, "gpu-1", facts(health="Unhealthy"), 1000)
    status = store.objects["gpu-1"]["status"]
    assert not status.get("cardList") and [card["uuid"] for card in status["unhealthyCardList"]] == ["GPU-0"]


def test_an_interval_someone_set_is_kept_with_a_warning_unless_forced():
    store = Store()
    publish(store, "gpu-1", facts(), 1000)
    store.objects["gpu-1"]["spec"]["updateInterval"] = 5000
    kept = publish(store, "gpu-1", facts(), 1000)
    assert not kept["changed"] and store.objects["gpu-1"]["spec"]["updateInterval"] == 5000
    assert kept["warnings"] == ["Scv gpu-1 keeps spec.updateInterval=5000, which someone set; set force_spec=true "
                                "to make it 1000"]
    forced = publish(store, "gpu-1", facts(), 1000, force_spec=True)
    assert forced["changed"] and forced["spec_updated"] and not forced["status_updated"]
    assert store.objects["gpu-1"]["spec"]["updateInterval"] == 1000
    assert forced["before"]["spec"] == {"updateInterval": 5000} and forced["after"]["spec"] == {"updateInterval": 1000}


def test_a_spec_that_is_not_an_object_is_refused_unless_forced():
    store = Store()
    publish(store, "gpu-1", facts(), 1000)
    store.objects["gpu-1"]["spec"] = "x"
    with pytest.raises(ApiError, match=r"^Scv gpu-1 has a spec that is not an object \(a str\).*nothing was written$"):
        publish(store, "gpu-1", facts(), 1000)
    assert store.objects["gpu-1"]["spec"] == "x"
    publish(store, "gpu-1", facts(), 1000, force_spec=True)
    assert store.objects["gpu-1"]["spec"] == {"updateInterval": 1000}


def test_a_conflict_starts_the_cycle_over_from_a_fresh_read():
    store = Store()
    publish(store, "gpu-1", facts(), 1000)
    store.fail["replace_status"] = [ApiError("the object has been modified", conflict=True, status=409)]
    done = publish(store, "gpu-1", facts(freeMemory=1), 1000)
    assert done["status_updated"] and store.objects["gpu-1"]["status"]["cardList"][0]["freeMemory"] == 1
    assert [verb for verb, _name, _dry in store.calls[-4:]] == ["get", "replace_status", "get", "replace_status"]


def test_an_scv_whose_status_cannot_be_written_is_deleted_again():
    store = Store()
    store.fail["replace_status"] = [ApiError("forbidden", status=403)]
    with pytest.raises(ApiError, match=r"^forbidden; the Scv created a moment before was deleted again$"):
        publish(store, "gpu-1", facts(), 1000)
    assert store.objects == {} and store.writes() == ["create", "replace_status", "delete"]


def test_when_the_undo_fails_too_the_message_says_to_delete_it_by_hand():
    store = Store()
    store.fail["replace_status"] = [ApiError("forbidden", status=403)]
    store.fail["delete"] = [ApiError("gone away", status=503)]
    with pytest.raises(ApiError, match=r"could not be deleted again either \(gone away\): delete it by hand "
                                       r"\(kubectl delete scv gpu-1\)$"):
        publish(store, "gpu-1", facts(), 1000)


def test_check_mode_writes_nothing_and_reports_what_would_be_written():
    store = Store()
    done = publish(store, "gpu-1", facts(), 1000, check_mode=True)
    assert done["changed"] and done["created"] and done["after"]["status"]["cardList"][0]["uuid"] == "GPU-0"
    assert store.objects == {} and store.writes() == ["create"] and store.calls[-1][2] is True
    publish(store, "gpu-1", facts(), 1000)
    changed = publish(store, "gpu-1", facts(freeMemory=7), 1000, check_mode=True)
    assert changed["status_updated"] and store.calls[-1] == ("replace_status", "gpu-1", True)
    assert store.objects["gpu-1"]["status"]["cardList"][0]["freeMemory"] == 81000


def test_remove_deletes_only_what_is_there():
    store = Store()
    assert remove(store, "gpu-1") == {"changed": False, "before": {}, "after": {}}
    publish(store, "gpu-1", facts(), 1000)
    gone = remove(store, "gpu-1")
    assert gone["changed"] and gone["before"]["spec"] == {"updateInterval": 1000} and store.objects == {}


def test_write_status_writes_over_the_object_as_read_and_fails_when_it_moved_on():
    """The agent's own path (agent/scv_writer.py): no dry run unless asked, a 409 over a stale read."""
    store = Store()
    publish(store, "gpu-1", facts(), 1000)
    read = store.get("gpu-1")
    written = write_status(store, read, {"cardList": [], "updateTime": "2026-11-29T00:00:00Z"})
    assert store.calls[-1] == ("replace_status", "gpu-1", False) and "managedFields" not in written["metadata"]
    assert store.objects["gpu-1"]["status"] == {"cardList": [], "updateTime": "2026-11-29T00:00:00Z"}
    with pytest.raises(ApiError) as stale:
        write_status(store, read, {"updateTime": "2026-11-29T00:00:01Z"})
    assert stale.value.conflict and store.objects["gpu-1"]["status"]["updateTime"] == "2026-11-29T00:00:00Z"
