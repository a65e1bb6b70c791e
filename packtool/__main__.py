from packtool.cli import main

main()
