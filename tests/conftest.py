"""Shared test settings."""

from hypothesis import settings

# The CI machine is small and shared: property tests are judged by what they find,
# never by how long one example took.
settings.register_profile("firstfault", deadline=None, database=None)
settings.load_profile("firstfault")
