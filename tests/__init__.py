"""The test suite; its layout mirrors the package."""
