from gpucredit.cli import main

main()
