"""``newestOnly`` (dashboard/static/util.js), run by node on the page's own file: of reads that
overlap, only the newest one's answer is used, whichever lands last. The page's reads are
throttled, not queued, so with a slow server an older answer could land after a newer one and
put the card, the table or the alerts back in time."""

from __future__ import annotations

from pathlib import Path

from .nodejs import needs_node, run_module

pytestmark = needs_node

BODY = """await (async () => {
  const pending = [];
  const read = newestOnly((name) => new Promise((resolve) => pending.push(() => resolve(name))));
  const older = read('older');
  const newer = read('newer');
  pending[1]();  // the newer answer lands first
  const got = { newer: await newer };
  pending[0]();  // then the older one
  got.older = (await older) === STALE ? 'stale' : 'used';
  const alone = read('alone');
  pending[2]();
  got.alone = await alone;  // a read with none after it is used
  const failing = newestOnly(async () => { throw new Error('500 boom'); });
  got.error = await failing().then(() => 'no error', (e) => e.message);
  return got;
})()"""


def test_only_the_newest_of_overlapping_reads_is_used(tmp_path: Path) -> None:
    got = run_module(tmp_path, ["util.js"], "import { STALE, newestOnly } from './util.js';", BODY)
    assert got == {"newer": "newer", "older": "stale", "alone": "alone", "error": "500 boom"}
