"""The local backend: worker hosts on this machine, an S3-compatible store on loopback."""
