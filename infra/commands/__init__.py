"""ftstack subcommands, one module each: register(subparsers) adds the parser and its handler."""
