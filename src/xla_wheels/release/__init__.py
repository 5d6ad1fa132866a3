"""Releasing to the fleet: receipts (gate evidence for exact wheels), lanes, promotion.

``receipts`` owns the receipt format, ``installed`` ties an installed environment to
locked wheel files, ``lanes`` owns ``build/lanes.toml`` and ``lanes.lock``, ``policy``
judges a promotion (pure), ``promote`` copies files between lane indexes, ``compare``
puts two bundles' receipts side by side, ``pylock`` writes PEP 751 lock files.
"""
