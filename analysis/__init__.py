"""Pure analysis over plain dataclasses: no database, web framework or plotting here."""
