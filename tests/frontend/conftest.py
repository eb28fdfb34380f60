"""Fixtures of the web UI's server-side tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # PBKDF2's deliberate slowness would dominate these tests (sessions are made with force_login);
    # hashing strength is not what they test.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
