"""The learner's own rate, watched for a changed plant (a second job on the device, a bigger
network): when it moves, the bounds the controller (balance.py) found belong to the old plant."""

from __future__ import annotations

import collections

from jaxrl_async.runtime.pipeline.balance_window import Window, pooled

MIN_BUSY_S = 1.0  # busy learner seconds a rate is read from
MIN_WINDOWS, MAX_WINDOWS = 5, 60  # windows a rate is read over: at least, and kept at most


class RateWatch:
  """`moved(w, key)`: whether the learner's rate (rollouts per busy second) at the setting
  `key`, (U, active actors), moved by more than `replan` from the first rate read there,
  however long ago.

  Read over the last five windows at the setting or more, and only from a second of busy time
  or more: a learner idle 93% of 2-s windows is busy 0.14 s a window, too little to time an
  update by, so as many windows are read as make that second. Rates are kept per setting
  across moves, so a learner that changed while the setting moved is found when a setting is
  read again. (Five windows held 0.7 s, and the rate was compared only within one stay at a
  setting: a learner 25 times faster again right after a move never replanned, and the bounds
  found while it was slow stayed.)"""

  def __init__(self, replan: float):
    self.replan = replan
    self._rates: dict[tuple[int, int], float] = {}
    self._recent: collections.deque = collections.deque(maxlen=MAX_WINDOWS)

  def moved(self, w: Window, key: tuple[int, int]) -> tuple[float, float] | None:
    """(the rate known at `key`, the rate now) where it moved that much, else None."""
    self._recent.append(w)
    recent, busy = [], 0.0
    for x in reversed(self._recent):
      recent.append(x)
      busy += x.seconds * (1 - x.learner_idle)
      if len(recent) >= MIN_WINDOWS and busy >= MIN_BUSY_S:
        break
    else:
      return None
    rate = pooled(recent).learner_rate
    known = self._rates.setdefault(key, rate)  # the first read at a setting: drift adds up
    if rate > 0 and abs(rate - known) > self.replan * known:
      self.forget()
      self._rates[key] = rate  # every other setting's rate was the old plant's
      return known, rate
    return None

  def differs(self, before: Window, after: Window, explained: float = 1.0) -> bool:
    """Whether the learner's rate moved by more than `replan` from one window to another,
    beyond a factor `explained` the move itself accounts for (between 1 and it is no move)."""
    was = before.learner_rate
    if was <= 0:
      return False
    lo, hi = min(1.0, explained), max(1.0, explained)
    return not lo * (1 - self.replan) <= after.learner_rate / was <= hi * (1 + self.replan)

  def moved_setting(self) -> None:
    """The windows after a move are another setting's: read afresh."""
    self._recent.clear()

  def forget(self) -> None:
    self._rates.clear()
    self._recent.clear()
