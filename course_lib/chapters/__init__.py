"""What only one notebook needs: setup check (00), regularization study (07), transfer plans (08), case study (10), troubleshooting (11), time to accuracy (12)."""
