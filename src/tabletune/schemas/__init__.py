"""Versioned, validated on-disk models: Profile, AcceptanceProfile, Table."""

from tabletune.schemas.acceptance import AcceptanceProfile
from tabletune.schemas.io import load_acceptance, load_profile, load_table, save_model
from tabletune.schemas.profile import Profile, ProfileMetadata
from tabletune.schemas.table import DOCUMENTED_EAGLE_TABLE, Table, TableError

__all__ = [
    "DOCUMENTED_EAGLE_TABLE",
    "AcceptanceProfile",
    "Profile",
    "ProfileMetadata",
    "Table",
    "TableError",
    "load_acceptance",
    "load_profile",
    "load_table",
    "save_model",
]
