"""Test plugins: fixtures live in tests/fix_*.py."""

pytest_plugins = ["tests.fix_postgres", "tests.fix_stack", "tests.fix_cdc", "tests.fix_relay"]
