"""Each site's audit verdict, and where the trainer keeps them so that a restart does not wipe a liar's slate.

    store = VerdictStore(f"{state_dir}/audit.json")     # beside the rollout ledger (STATE_DIR/rollouts.jsonl)
    verdicts, moments = store.load()                     # {site: Verdict},
                                                           {site: [surprisal sum, variance sum, tokens]}
    store.save(verdicts, moments)                        # propose (temp file, fsync), commit (rename, fsync the dir)
    key = store.key()                                    # the audit's draw key, STATE_DIR/audit.key (0600), made once

A crash at any instant leaves the previous file or the new one, whole. The key lives beside it, never in a log or
the file: with it a restarted trainer draws the same rollouts for audit as before (those it offers again), and a
site, which never sees it, still cannot tell which of its rollouts are checked.
"""
import json
import logging
import math
import os
import pathlib
from dataclasses import asdict, dataclass, field, fields

from hilo.log import atomic_file
from hilo.replay.snapshot import fsync_dir
from hilo.schemas.errors import ConfigError

from .audit_noise import noise_z

logger = logging.getLogger(__name__)
FORMAT = 1
KEY_BYTES = 32
FAILED_KEPT = 16  # a verdict's evidence lists the ids of its site's last failed rollouts, at most this many


@dataclass
class Verdict:
    """One site's audit so far. worst: the worst per-token difference over its audited rollouts; worst_passed: over the
    passed ones (an honest site's margin is tolerance / worst_passed). unaudited: drawn for audit but not checkable
    (its versions no longer kept). refused: rollouts whose version stamps cannot be true (a version not published, a
    span wider than S), each counted a failure too. spanning: audited rollouts that claimed a span of versions. z: the
    sampling test's statistic over `tokens`. noise_z: the statistical verdict's, over noise_tokens (audit_noise.py).
    served: what the site says served its rollouts (engine, adapter dtype).
    failed_rollouts: "prompt/sample" of its latest failures (a rollout judged again after a restart counts once)."""

    site: str
    audited: int = 0
    passed: int = 0
    failed: int = 0
    unaudited: int = 0
    refused: int = 0
    spanning: int = 0
    worst: float = 0.0
    worst_passed: float = 0.0
    tokens: int = 0
    z: float = 0.0
    noise_total: float = 0.0  # the statistical verdict: the sum of its passed tokens' |difference|, over noise_tokens
    noise_tokens: int = 0
    noise_z: float = 0.0
    quarantined: bool = False
    evidence: str | None = None
    probation: int = 0  # while quarantined: its audited rollouts passed in a row (the probe)
    served: str | None = None
    failed_rollouts: list = field(default_factory=list)

    def to_dict(self) -> dict:
        """The JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Verdict":
        """From the JSON form (fields it does not know are passed over)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def failure(self, rollout_id: str) -> bool:
        """Count a failed rollout, once: False when `rollout_id` already failed (offered again after a restart)."""
        if rollout_id in self.failed_rollouts:
            return False
        self.failed += 1
        self.failed_rollouts = [*self.failed_rollouts, rollout_id][-FAILED_KEPT:]
        return True


class VerdictStore:
    """The verdicts' file at `path` (its folder is made), and the draw key beside it."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def load(self) -> tuple:
        """({site: Verdict}, {site: sampling moments}) as last saved; empty when never saved."""
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            sites = {s: Verdict.from_dict(v) for s, v in data["sites"].items()}
            return sites, {s: list(m) for s, m in data.get("moments", {}).items()}
        except FileNotFoundError:
            return {}, {}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{self.path}: not the trainer's audit verdicts ({type(e).__name__}: {e}); restore it "
                              f"from a backup, or remove it to start every site clean (a quarantined site "
                              f"too)") from None

    def save(self, verdicts: dict, moments: dict) -> None:
        """Replace the file with these verdicts, atomically and durably."""
        text = json.dumps({"format": FORMAT, "sites": {s: v.to_dict() for s, v in sorted(verdicts.items())},
                           "moments": moments}, sort_keys=True)
        atomic_file.replace(pathlib.Path(self.path), text)
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))

    def key(self) -> bytes:
        """The audit's draw key (made on first use, readable by this user only)."""
        path = os.path.join(os.path.dirname(os.path.abspath(self.path)), "audit.key")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            with open(path, "rb") as f:
                key = f.read()
            if len(key) != KEY_BYTES:
                raise ConfigError(f"{path}: {len(key)} bytes, not the audit's {KEY_BYTES}-byte key; remove it (a new "
                                  f"one is made)") from None
            return key
        key = os.urandom(KEY_BYTES)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(os.path.dirname(path))
        return key



class Verdicts:
    """Every site's verdict and what moves it: failures toward a quarantine, the sampling test, the probe that
    releases a site, an operator's clear. cfg: the AuditConfig (quarantine_after, sampling_*, release_after); store:
    a VerdictStore (its verdicts are loaded now and saved at every quarantine, release and `save`), or None."""

    def __init__(self, cfg, metrics=None, store=None):
        self.cfg, self.metrics, self.store = cfg, metrics, store
        # site -> Verdict; site -> [sum of (surprisal - mean), sum of variances, tokens] (the sampling test)
        self.by_site, self.moments = store.load() if store is not None else ({}, {})
        self.probes = {}                 # the same moments, of a quarantined site's probe
        self.probe_noise = {}            # site -> [sum of |difference|, tokens] of its probe (the statistical verdict)
        self.noise_of = {}               # site -> the honest Noise its statistical verdict was last judged against
        self.newly_quarantined = []      # sites quarantined since the exchange last asked
        for v in self.by_site.values():
            if metrics is not None:
                metrics.set("site_quarantined", int(v.quarantined), site=v.site)
            if v.quarantined:
                logger.warning("site %s stays quarantined (its verdict, kept in %s): %s", v.site, store.path,
                               v.evidence)

    def of(self, site: str) -> Verdict:
        """The verdict of `site` (a new, clean one for a site not seen yet)."""
        v = self.by_site.get(site)
        if v is None:
            v = self.by_site[site] = Verdict(site)
            if self.metrics is not None:
                self.metrics.set("site_quarantined", 0, site=site)
        return v

    def failed(self, v: Verdict, reason: str, evidence: str) -> str:
        """After a failed rollout of a site not quarantined (counted): quarantine it at `quarantine_after`; `reason`."""
        if v.failed >= self.cfg.quarantine_after:
            refused = f", {v.refused} refused by their stamps" if v.refused else ""
            self.quarantine(v, f"{v.failed} of {v.audited + v.refused} rollouts checked failed ({v.audited} audited"
                               f"{refused}); the latest: {evidence}")
        return reason

    def sampling(self, v: Verdict, lp, mean, var) -> None:
        """Add a passed rollout's tokens to the site's sampling test; quarantine past the limit. A quarantined site's
        tokens go to its probe's own test (the quarantine's z stays in its verdict as evidence)."""
        probing = v.quarantined
        m = (self.probes if probing else self.moments).setdefault(v.site, [0.0, 0.0, 0])
        m[0] += float((-lp - mean).sum())
        m[1] += float(var.sum())
        m[2] += len(lp)
        z = m[0] / math.sqrt(m[1]) if m[1] > 0 else 0.0
        if probing:
            if m[2] >= self.cfg.sampling_min_tokens and abs(z) > self.cfg.sampling_z_limit:
                self._restart_probe(v)  # on probation and still sampling from something else
            return
        v.tokens, v.z = m[2], z
        if v.tokens >= self.cfg.sampling_min_tokens and abs(v.z) > self.cfg.sampling_z_limit:
            self.quarantine(v, f"its sampled tokens are not drawn from the versions they claim: standardized surprisal "
                               f"z = {v.z:+.1f} over {v.tokens} audited tokens (honest sampling: about N(0, 1); limit "
                               f"{self.cfg.sampling_z_limit:g}); their log-probabilities were right")

    def noise(self, v: Verdict, total: float, tokens: int, noise) -> None:
        """Add a passed rollout's |differences| (their sum, over `tokens`) to the site's statistical verdict, against
        the honest `noise` of its engine and dtype; quarantine past the limit. A quarantined site's go to its
        probe's."""
        self.noise_of[v.site] = noise
        if v.quarantined:
            m = self.probe_noise.setdefault(v.site, [0.0, 0])
            m[0] += total
            m[1] += tokens
            return
        v.noise_total += total
        v.noise_tokens += tokens
        v.noise_z = noise_z(v.noise_total, v.noise_tokens, noise, self.cfg.noise_headroom)
        if v.noise_tokens >= self.cfg.noise_min_tokens and v.noise_z > self.cfg.noise_z_limit:
            self.quarantine(v, f"its log-probabilities differ from the versions they claim more than honest serving "
                               f"does: mean |difference| {v.noise_total / v.noise_tokens:.3g} over {v.noise_tokens} "
                               f"audited tokens, z = {v.noise_z:+.1f} against the honest {noise.abs_mean:.3g} (x "
                               f"{self.cfg.noise_headroom:g} headroom; limit {self.cfg.noise_z_limit:g}), each token "
                               f"within the tolerance")

    def probe(self, v: Verdict, failed: bool) -> str:
        """Count a quarantined site's checked rollout (a failure already counted) toward its release; dropped either
        way."""
        if failed:
            self._restart_probe(v)
            return "quarantined"
        v.probation += 1
        total, var, tokens = self.probes.get(v.site, (0.0, 0.0, 0))
        z = total / math.sqrt(var) if var > 0 else 0.0
        noise = self.noise_of.get(v.site)
        nz = noise_z(*self.probe_noise.get(v.site, (0.0, 0)), noise, self.cfg.noise_headroom) if noise else 0.0
        # release asks for half the quarantine's z limits: a site on probation must look honest, not merely unproven
        if v.probation >= self.cfg.release_after and tokens >= self.cfg.sampling_min_tokens \
                and abs(z) <= self.cfg.sampling_z_limit / 2 and nz <= self.cfg.noise_z_limit / 2:
            self._release(v,
                          f"it passed its probe: {v.probation} audited rollouts in a row, sampling z = {z:+.1f} over "
                          f"{tokens} tokens, statistical verdict z = {nz:+.1f}")
        return "quarantined"

    def _restart_probe(self, v: Verdict) -> None:
        """A probe starts over: no passed rollouts, and a sampling test of the probe's own tokens."""
        v.probation = 0
        self.probes.pop(v.site, None)
        self.probe_noise.pop(v.site, None)

    def quarantine(self, v: Verdict, evidence: str) -> None:
        """Quarantine `v`'s site: said loudly, saved at once (a trainer restarted a moment later still refuses it)."""
        v.quarantined, v.evidence = True, evidence
        self._restart_probe(v)
        self.save()
        self.newly_quarantined.append(v.site)
        if self.metrics is not None:
            self.metrics.set("site_quarantined", 1, site=v.site)
        logger.error("QUARANTINED site %s: %s. Its rollouts are dropped until an operator clears it%s; the run goes on "
                     "with the other sites", v.site, evidence,
                     f" or {self.cfg.release_after} in a row pass the audit" if self.cfg.release_after else "")

    def clear(self, site: str) -> None:
        """An operator's decision: `site`'s rollouts are accepted again (its counts stay; its sampling test starts
        over)."""
        self._release(self.of(site), "an operator cleared it")

    def _release(self, v: Verdict, why: str) -> None:
        v.quarantined, v.evidence, v.failed, v.failed_rollouts = False, None, 0, []
        self._restart_probe(v)
        v.tokens, v.z = 0, 0.0  # its sampling test and its statistical verdict start over
        v.noise_total, v.noise_tokens, v.noise_z = 0.0, 0, 0.0
        self.moments.pop(v.site, None)
        self.save()
        if self.metrics is not None:
            self.metrics.set("site_quarantined", 0, site=v.site)
        logger.warning("site %s released from quarantine (%s): its rollouts are accepted again", v.site, why)

    def save(self) -> None:
        """Write every verdict to the store (none: nothing to do)."""
        if self.store is not None:
            self.store.save(self.by_site, self.moments)
