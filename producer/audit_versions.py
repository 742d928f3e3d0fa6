"""The versions the trainer's audit checks rollouts against: the newest published ones' params, as each site served
them.

    kept = KeptVersions(names, keep=S + 1)
    kept.remember(version, replica.state.params)     # after every published version (and at start): the head moves
    kept.params(version, "bfloat16")                 # {parameter name: fp32 tensor}, rounded as a bf16 site exported it
    stamp_refusal(rollout, kept.head, max_span=S)    # why a rollout's version stamps are not believable, or None

A version is kept in fp32 (the replica's params, what a float32 site exports) and, for each other dtype a site
reports, once rounded to it and stored in that dtype (half the bytes), made when first asked and dropped with its
version. So a site's rollouts are recomputed with the adapter it gave its engine, whatever dtype it chose.
"""
import collections

import torch


class KeptVersions:
    """The params of the newest `keep` versions remembered, by version; `head`: the newest (None before any)."""

    def __init__(self, names, keep: int):
        self.names, self.keep = names, keep
        self._fp32 = collections.OrderedDict()   # version -> {name: fp32 params}
        self._rounded = {}                       # (version, dtype name) -> {name: params in that dtype}
        self.head = None

    def remember(self, version: int, params) -> None:
        """Keep `version`'s params (a replica's, in name order); the oldest beyond `keep` go."""
        self._fp32[version] = {n: p.detach().to(torch.float32).clone() for n, p in zip(self.names, params)}
        self._fp32.move_to_end(version)
        self.head = version if self.head is None else max(self.head, version)
        while len(self._fp32) > self.keep:
            gone, _ = self._fp32.popitem(last=False)
            for k in [k for k in self._rounded if k[0] == gone]:
                del self._rounded[k]

    def params(self, version: int, dtype: str = "float32") -> dict | None:
        """{name: fp32 tensor} of `version` as exported in `dtype` (rounded to it), None when it is not kept."""
        fp32 = self._fp32.get(version)
        if fp32 is None or dtype == "float32":
            return fp32
        rounded = self._rounded.get((version, dtype))
        if rounded is None:
            rounded = self._rounded[version, dtype] = {n: t.to(getattr(torch, dtype)) for n, t in fp32.items()}
        return {n: t.to(torch.float32) for n, t in rounded.items()}

    @property
    def kept_bytes(self) -> int:
        """Bytes of params held, fp32 and rounded copies."""
        return sum(t.numel() * t.element_size() for d in (*self._fp32.values(), *self._rounded.values())
                   for t in d.values())

    def __contains__(self, version) -> bool:
        return version in self._fp32

    def __iter__(self):
        return iter(self._fp32)

    def __len__(self) -> int:
        return len(self._fp32)


def stamp_refusal(r, head: int | None, max_span: int) -> str | None:
    """Why rollout `r`'s version stamps cannot be true, or None: it claims a version the trainer has not published
    (newer than `head`), or a span of more than `max_span` versions (the staleness bound: no such rollout is kept)."""
    claim = f"prompt {r.prompt_id} sample {r.sample} is stamped v{r.version_start}..v{r.version_end}"
    if head is not None and r.version_end > head:
        return f"{claim}, but v{r.version_end} is not published (the trainer's head is v{head})"
    if r.version_end - r.version_start > max_span:
        return (f"{claim}: a span of {r.version_end - r.version_start} versions, wider than the staleness bound "
                f"S = {max_span}")
    return None
